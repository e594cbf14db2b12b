"""The stream side of a walk's dataflow: buffering items at the consumer, ending streams at the producer.

A mixin of WalkState; it reads and writes the walk state's fields.
"""

from __future__ import annotations

from typing import Any

from walkserve.graph.plan import FromStream, StreamInfo
from walkserve.streaming.buffer import StreamBuffer
from walkserve.worker.plan_index import DataflowError, Path


class StreamSide:
    def _prefixes(self, info: StreamInfo) -> set[Path]:
        """Outer instances of the producer's loop that this stream has (or will have) items for."""
        return {(info.index, prefix) for prefix in self.prefixes[info.index]}

    def _end_streams(self) -> None:
        for node in self._producers:
            for info in self.idx.produces.get(node, ()):
                for key in self._prefixes(info):
                    if key in self.stream_ended:
                        continue
                    limit = self._limit(info.producer_scope, key[1])
                    if limit is None or self.items_sent[key] < limit or self._held_for(node):
                        continue
                    self.stream_ended.add(key)
                    rank = self.ranks[info.consumer]
                    if rank == self.rank:
                        self._stream_end(info.index, key[1], limit)
                    else:
                        self.sink.send(
                            rank, "end", self, stream=info.index, prefix=key[1], n_items=limit
                        )

    # ---- streams, consumer side -------------------------------------------------------------
    def _buffer(self, key: tuple[int, Path]) -> StreamBuffer:
        buf = self.buffers.get(key)
        if buf is None:
            info = self.plan.streams[key[0]]
            buf = self.buffers[key] = StreamBuffer(info.policy, info.capacity)
        return buf

    def _stream_item(self, stream: int, prefix: Path, index: int, value: Any) -> None:
        key = (stream, prefix)
        buf = self._buffer(key)
        pending = self.reorder[key]
        pending[index] = value
        while buf.n_items in pending:
            item = pending.pop(buf.n_items)
            self.templates.setdefault(key, item)
            buf.push(item)
        info = self.plan.streams[stream]
        if buf.full and key not in self.pausing:
            self.pausing.add(key)
            self._flow(info, prefix, True)
        self._try(info.consumer)

    def _stream_end(self, stream: int, prefix: Path, n_items: int) -> None:
        key = (stream, prefix)
        buf = self._buffer(key)
        if buf.n_items != n_items or self.reorder.get(key):
            raise DataflowError(
                f"stream {stream} ended with {n_items} items but {buf.n_items} arrived in order"
            )
        buf.end()
        self._try(self.plan.streams[stream].consumer)

    def _consumed_chunks(self, node: str, path: Path) -> None:
        for slot in self.plan.nodes[node].inputs:
            source = self.plan.sources[(node, slot)]
            if isinstance(source, FromStream):
                info = self.plan.streams[source.stream]
                d = self.idx.depth[info.consumer_scope]
                key = (source.stream, path[:d])
                buf = self._buffer(key)
                buf.consumed(path[d])
                if key in self.pausing and not buf.full:
                    self.pausing.discard(key)
                    self._flow(info, path[:d], False)

    def _flow(self, info: StreamInfo, prefix: Path, pause: bool) -> None:
        rank = self.ranks[info.producer]
        if rank == self.rank:
            self.flow(info.index, prefix, pause)
        else:
            self.sink.send(rank, "flow", self, stream=info.index, prefix=prefix, pause=pause)
