"""The arithmetic of one pi0 action chunk, and what this machine's matmuls do per CPU second (``./dev bench pi``).

FLOPs count the matmuls and the attention products (2 per multiply-add);
norms, activations and softmax are left out (a few percent). Per request:

    vision  per camera image: SigLIP over P = (R/14)^2 patches, then the projector
    prefix  PaliGemma over T = cameras * P + prompt tokens (bidirectional: T keys a row)
    flow    num_inference_steps x the expert over H action tokens, each row over T (+ pi0's state token) + H keys

walkserve's served prefix skips the last layer's o_proj and MLP (``kv_only``);
transformers' PI0 runs every camera slot through SigLIP, absent ones included.
"""

from __future__ import annotations

import time


def _gemma_layer(size, rows: int, keys: int, tail: bool = True) -> float:
    """Multiply-adds of one Gemma layer over ``rows`` tokens that each see ``keys`` keys (``tail``: o_proj and MLP)."""
    d, q, kv = size.hidden_size, size.q_size, size.kv_size
    macs = rows * d * (q + 2 * kv) + 2 * rows * keys * q  # q, k, v; scores and weighted values
    if tail:
        macs += rows * q * d + 3 * rows * d * size.intermediate_size
    return macs


def chunk_flops(config, cameras: int, prompt_tokens: int, kv_only: bool, vision_slots: int | None = None) -> dict:
    """FLOPs of one chunk by phase: {"vision", "prefix", "flow"} (``vision_slots``: images SigLIP runs, default
    ``cameras``)."""
    v = config.vision
    patches = config.image_tokens
    siglip = patches * (v.num_channels * v.patch_size**2 * v.hidden_size + v.hidden_size * config.paligemma.hidden_size)
    siglip += v.num_hidden_layers * (patches * (4 * v.hidden_size**2 + 2 * v.hidden_size * v.intermediate_size)
                                     + 2 * patches * patches * v.hidden_size)
    pg, ex = config.paligemma, config.expert
    t = cameras * patches + prompt_tokens
    layers = [_gemma_layer(pg, t, t, tail=not (kv_only and i == pg.num_hidden_layers - 1))
              for i in range(pg.num_hidden_layers)]
    h, w = config.chunk_size, ex.hidden_size
    context = t + (0 if config.pi05 else 1)
    step = ex.num_hidden_layers * _gemma_layer(ex, h, context + h) + h * (2 * 32 * w)  # action in / out
    step += 0 if config.pi05 else h * 3 * w * w  # pi0's action-time MLP ([a | t] -> W -> W)
    return {"vision": 2.0 * siglip * (vision_slots or cameras), "prefix": 2.0 * sum(layers),
            "flow": 2.0 * config.num_inference_steps * step}


def gemm_rate(m: int, k: int, n: int, repeats: int = 8) -> float:
    """Best float32 GFLOP/s of an [m, k] @ [k, n] product per second of this thread's CPU time."""
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        a @ b
        best = min(best, time.thread_time() - t0)
    return 2.0 * m * k * n / max(best, 1e-9) / 1e9
