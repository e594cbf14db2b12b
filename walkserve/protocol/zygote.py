"""The zygote pipe: the conductor's supervisor asks the worker zygote to fork ranks; the zygote says
when it is ready, which pid each fork got and when a worker exits. One ASCII line per message over
the zygote's stdin and stdout (a pipe private to the two processes, so no run token):

    supervisor -> zygote:   fork <rank>
    zygote -> supervisor:   ready | forked <rank> <pid> | exit <pid> <returncode: -signal or exit code>
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fork:
    rank: int


@dataclass(frozen=True)
class Ready:
    pass


@dataclass(frozen=True)
class Forked:
    rank: int
    pid: int


@dataclass(frozen=True)
class Exited:
    pid: int
    returncode: int


PipeMessage = Fork | Ready | Forked | Exited
_WORDS = {Fork: "fork", Ready: "ready", Forked: "forked", Exited: "exit"}
_TYPES = {word: cls for cls, word in _WORDS.items()}
_ARITY = {Fork: 1, Ready: 0, Forked: 2, Exited: 2}


def encode_line(msg: PipeMessage) -> bytes:
    fields = [str(v) for v in vars(msg).values()]
    return (" ".join([_WORDS[type(msg)], *fields]) + "\n").encode()


def decode_line(line: str | bytes) -> PipeMessage | None:
    """The message a line holds, or None for a line that is not one (ignored by both sides)."""
    parts = (line.decode() if isinstance(line, bytes) else line).split()
    cls = _TYPES.get(parts[0]) if parts else None
    if cls is None or len(parts) - 1 != _ARITY[cls]:
        return None
    try:
        return cls(*(int(p) for p in parts[1:]))
    except ValueError:
        return None
