"""The walks of Orpheus TTS (torch-free): the Llama LM decodes audio tokens that stream into the SNAC codec.

    prefill:  input.prompt -> lm(tokens)                        (fills the KV cache)
    decode:   input.last ─> DynamicLoop[ lm(tokens) -> token ]   carry lm.token -> lm.tokens
                               token_ranges: the 4096 ids valid for the stream position, + END_OF_SPEECH
                               stop: END_OF_SPEECH or stop_token_ids (never streamed), at most max_tokens
              lm.token ~> codec.codes   SlidingWindow(28, 7)     (emission rule: emission.py)
              codec.audio -> client:audio
              playback: a token is 1/7 of a 2048-sample frame; the first chunk (window 0) is
                        two frames after 28 tokens, then one frame per 7 tokens (one window)

The state machine is the text LM's (prefill unless the prompt has one token, then decode).
"""

from __future__ import annotations

from walkserve.graph import (
    Client,
    GraphEdge,
    GraphNode,
    Parallel,
    Playback,
    StreamingGraphEdge,
    Walk,
    WalkGraph,
)
from walkserve.models.llama.graph import LM, decode_loop, prefill_walk, prompt_state_machine
from walkserve.models.orpheus.emission import FRAME_TOKENS, POLICY, WINDOW_TOKENS
from walkserve.models.orpheus.tokens import (
    END_OF_SPEECH,
    FRAME_SAMPLES,
    SAMPLE_RATE,
    allowed_ranges,
)

CODEC = "codec"
INPUT_SLOT, OUTPUT_NAME = "codes", "audio"  # OrpheusCodec's slot and output (codec.py imports torch; this must not)
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
PLAYBACK = {  # what each firing on the path to the client's audio is worth (emission.py)
    LM: Playback(FRAME_S / FRAME_TOKENS, every=FRAME_TOKENS, first=WINDOW_TOKENS, first_s=2 * FRAME_S),
    CODEC: Playback(FRAME_S, first_s=2 * FRAME_S),
}


def decode_walk() -> Walk:
    """The LM loop and the codec that consumes its tokens as they stream."""
    loop = decode_loop({"token_ranges": allowed_ranges}, always_stop=(END_OF_SPEECH,))
    codec = GraphNode(CODEC, inputs=[INPUT_SLOT], outputs=[OUTPUT_NAME])
    return Walk(
        "decode",
        Parallel(loop, codec),
        edges=[
            GraphEdge("input.last", f"{LM}.tokens"),
            StreamingGraphEdge(f"{LM}.token", f"{CODEC}.{INPUT_SLOT}", POLICY),
            GraphEdge(f"{CODEC}.{OUTPUT_NAME}", Client("audio")),
        ],
        inputs=["last"],
        playback=PLAYBACK,
    )


def build_graph() -> WalkGraph:
    return WalkGraph("orpheus", [prefill_walk(), decode_walk()], prompt_state_machine())
