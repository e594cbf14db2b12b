"""What the talker will read from the thinker (the speech seam), through the KV engine on the walks' own nodes.

``build_graph(taps=thinker_taps(k), ...)`` declares, on every thinker node, captures of the input of
layer 0 (the input embedding: text rows are the token embedding, media rows the encoder's tokens) and
of layer k (``accept_hidden_layer``). Driving the engine with each walk's declared operations, piece by
piece (a spoken answer's then one decode step), gives exactly the dense whole-prompt pass's layer inputs at every
position, and the greedy token.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.qwen3_omni.conftest import rgb, wave
from tests.models.qwen3_omni.test_graph import _array
from walkserve.core.options import KVOptions
from walkserve.core.sampling import SamplingParams
from walkserve.engines.base import Firing
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.engines.spec import Batch
from walkserve.graph import DROP, GraphEdge
from walkserve.layers.attention import DenseAttention
from walkserve.models.qwen3_omni import graph as g
from walkserve.models.qwen3_omni.processor import OmniParams, Qwen3OmniProcessor
from walkserve.models.qwen3_omni.thinker.generate import positions_tensor, thinker_inputs
from walkserve.models.qwen3_omni.thinker.prompt_pieces import request_inputs
from walkserve.models.qwen3_omni.thinker.weights import load_thinker_components

ACCEPT = 3  # the tiny talker's accept_hidden_layer


def _tensor(a) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(a.data, dtype=np.dtype(a.dtype)).reshape(a.shape).copy())


def _thinker_node(graph, walk: str):
    return next(n for n in graph.walks[walk].nodes() if n.name == g.THINKER)


@pytest.mark.parametrize("merge", [False, True])  # a spoken answer's pieces; a text answer's (text merged in)
def test_taps_equal_the_dense_layer_inputs(ours_dir, merge):
    parts = load_thinker_components(ours_dir, progress=False)
    processor = Qwen3OmniProcessor(ours_dir)
    messages = [{"role": "user", "content": [{"type": "audio", "audio": _array(wave(1.2)), "sample_rate": 16000},
                                             {"type": "text", "text": "and"},
                                             {"type": "image", "image": _array(rgb(40, 60))}]}]
    request, _ = processor.thinker_request("chat", {"messages": messages}, OmniParams())
    pieces = request_inputs(request, processor.config.tokens, merge=merge)
    assert pieces["walks"] == ([g.PREFILL_MEDIA] if merge else [g.PREFILL_TEXT, g.PREFILL_AUDIO, g.PREFILL_TEXT,
                                                                  g.PREFILL_VISION, g.PREFILL_TEXT])
    graph = g.build_graph(taps=g.thinker_taps(ACCEPT), tap_edge=lambda ep: GraphEdge(ep, DROP))
    engine = KVCacheEngine(g.THINKER, parts.lm, "cpu", torch.float32, KVOptions(block_size=4, num_blocks=64))
    taps: dict[str, list[torch.Tensor]] = {g.EMBED_TAP: [], g.ACCEPT_TAP: []}
    for k, walk in enumerate(pieces["walks"]):
        inputs = {slot: _tensor(pieces[g.step_key(k, slot)]) for slot in g.WALK_INPUTS[walk]}
        node_walk = g.first_walk(walk) if merge else walk  # a text answer's last (here: only) piece samples token 0
        if g.MEL in inputs:
            inputs["embeds"] = parts.audio.forward_batch(Batch.of([{"mel": inputs.pop("mel")}]))[0]["audio_embeds"]
        if g.PIXELS in inputs:
            rows = inputs[g.VISUAL_ROWS] if walk == g.PREFILL_MEDIA else inputs.pop(g.VISUAL_ROWS)  # the thinker's too
            out = parts.vision.forward_batch(Batch.of([{g.PIXELS: inputs.pop(g.PIXELS), g.GRID: inputs.pop(g.GRID),
                                               g.VISUAL_ROWS: rows}]))[0]
            inputs["deepstack"] = out["deepstack"]
            inputs["visual_embeds" if walk == g.PREFILL_MEDIA else "embeds"] = out[
                "visual_embeds" if walk == g.PREFILL_MEDIA else "image_embeds"]
        got = _fire(engine, k, node_walk, _thinker_node(graph, node_walk), inputs)
        for name in taps:
            taps[name].append(got[name])
    if merge:  # token 0 came with the prompt's last row
        last = {"token": got["token"], **{name: parts[-1][-1:] for name, parts in taps.items()}}
        taps = {name: [torch.cat(parts)[:-1]] for name, parts in taps.items()}
    else:  # a spoken answer: the last prompt token is its own step
        last = _fire(engine, 99, g.DECODE, _thinker_node(graph, g.DECODE), {"tokens": _tensor(pieces["last"])})

    embeds, deepstack = thinker_inputs(parts, request)
    capture = {0: None, ACCEPT: None}
    with torch.no_grad():
        hidden = parts.lm(torch.tensor(request.input_ids), positions_tensor(request), DenseAttention("causal"),
                          inputs_embeds=embeds, deepstack=deepstack, capture=capture)
    for name, layer in ((g.EMBED_TAP, 0), (g.ACCEPT_TAP, ACCEPT)):
        got = torch.cat([*taps[name], last[name]])  # every prompt position, the last one from the decode step
        torch.testing.assert_close(got, capture[layer], rtol=0, atol=1e-4)
    assert float((capture[ACCEPT] - capture[0]).abs().max()) > 0.1  # the two taps are different things
    assert int(last["token"]) == int(parts.lm.compute_logits(hidden[-1:]).argmax())


def _fire(engine: KVCacheEngine, k: int, walk: str, node, inputs: dict) -> dict:
    f = Firing(k, "r", walk, node.name, node.component, "forward", (), inputs, tuple(node.outputs),
               sampling=SamplingParams(temperature=0.0), node_params=node.params)
    engine.submit(f)
    for _ in range(100):
        for r in engine.step():
            assert r.error is None, r.error
            return r.outputs
    raise AssertionError(f"{walk} was never answered")
