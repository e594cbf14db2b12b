"""Step costs predicted from shapes, for models that cannot run here (the released sizes on GPUs this host lacks).

A node's step of ``b`` items on a GPU takes (a roofline, derated)::

    t(b) = LAUNCH_S + max(flops(b) / (peak FLOP/s x MFU), bytes(b) / (peak bytes/s x MBU))
    flops(b) = b x tokens per item x (2 x active parameters + attention over the context)
    bytes(b) = dense weights + expert weights x the share of experts b x tokens route to
               + b x context x KV bytes per token

Parameters come from the checkpoint (``ComponentSpec.weight_bytes``: as the
headers count them) and the configs (experts, top-k, layers, heads); how many
items a request makes, and of how many tokens, from the workload (family
rules below). The result is a ``CostTable`` like a profile's, so the same
search and simulation rank the placements. Every figure is a prediction from
these assumptions, never a measurement; the constants below are the
assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from walkserve.core.errors import ConfigError
from walkserve.models.base import Model
from walkserve.planner.costs import CostTable, NodeCost, RequestItems
from walkserve.planner.family_workloads import chat as _chat
from walkserve.planner.profile import REQUESTS_ALONE
from walkserve.planner.workload import RequestKind, Workload

MFU = 0.5  # share of the peak bf16 FLOP/s a step reaches
MBU = 0.7  # share of the peak memory bandwidth
LAUNCH_S = 3e-4  # a step's fixed cost (kernel launches, scheduling) with CUDA graphs
HOP_S, HOP_LATENCY_S = 2e-5, 5e-5  # a cross-GPU message: sender/receiver time, arrival (NVLink, one host)
PROMPT_TOKENS = 64  # a chat request's prompt (template + a short question)
BATCHES = (1, 4, 16, 64)


@dataclass(frozen=True)
class Gpu:
    name: str
    flops: float  # peak dense bf16 FLOP/s
    bandwidth: float  # peak memory bytes/s


GPUS = {"h100": Gpu("H100 SXM (80 GB)", 989e12, 3.35e12), "h200": Gpu("H200 SXM (141 GB)", 989e12, 4.8e12)}


def gpu_for(memory: int | None, name: str | None = None) -> Gpu:
    """``name`` (h100, h200), else the GPU whose memory the budget suggests (over 100 GiB: H200)."""
    if name:
        if name.lower() not in GPUS:
            raise ConfigError(f"--gpu {name}: choose {', '.join(GPUS)}")
        return GPUS[name.lower()]
    return GPUS["h200" if memory and memory > 100 * 2**30 else "h100"]


@dataclass(frozen=True)
class UnitShape:
    """One profiled unit's work per item, from shapes."""

    name: str
    dense_bytes: float  # weights every step reads
    expert_bytes: float = 0.0  # MoE expert weights: a step reads those its tokens route to
    topk_share: float = 0.0  # experts per token / experts
    flops_per_token: float = 0.0  # 2 x active parameters, attention included
    tokens_per_item: float = 1.0
    kv_bytes_per_item: float = 0.0  # KV read per item per step

    def step_seconds(self, batch: int, gpu: Gpu) -> float:
        tokens = batch * self.tokens_per_item
        touched = 1 - (1 - self.topk_share) ** tokens if self.topk_share else 0.0
        nbytes = self.dense_bytes + self.expert_bytes * touched + batch * self.kv_bytes_per_item
        return LAUNCH_S + max(tokens * self.flops_per_token / (gpu.flops * MFU), nbytes / (gpu.bandwidth * MBU))


def shape_table(key: str, shapes: list[UnitShape], items: dict[str, float], gpu: Gpu) -> CostTable:
    """A cost table whose samples are the shapes' predicted steps at a few batch sizes (one 'thread': a GPU)."""
    nodes = {}
    for s in shapes:
        cost = NodeCost()
        for b in BATCHES:
            cost.add(1, b, float(b), s.step_seconds(b, gpu))
        nodes[s.name] = cost
    table = CostTable(key, nodes, {k: v for k, v in items.items() if k in nodes}, {}, HOP_S, "shapes", HOP_LATENCY_S)
    return table


def costs_from_shapes(model: Model, workload: Workload, gpu: Gpu) -> CostTable:
    """The model's cost table predicted from its shapes for ``workload`` on ``gpu``."""
    describe = DESCRIBERS.get(model.ref.family)
    if describe is None:
        raise ConfigError(f"--shapes: no shape cost model for {model.ref.family} (have: {', '.join(DESCRIBERS)})")
    shapes, items = describe(model, workload)
    table = shape_table(f"{model.ref.family}-shapes-{gpu.name}", shapes, items, gpu)
    table.requests = per_request_items(model, workload, describe)
    return table


def per_request_items(model: Model, workload: Workload, describe) -> list[RequestItems]:
    """The items each of the mix's first requests makes, by its kind's rules (as a profile counts them per request):
    a spoken answer's talker, code predictor and Code2Wav counts agree around the loop, where the mix's mean
    (9.6 frames and 144 code-predictor steps) does not close it."""
    per_kind = {k.name: describe(model, Workload((k,), name=workload.name))[1] for k in workload.kinds}
    return [RequestItems(k.name, {n: v for n, v in per_kind[k.name].items() if v > 0})
            for k in workload.mix(REQUESTS_ALONE)]


# ---- Qwen3-Omni -----------------------------------------------------------------------------


def _is_spoken(kind: RequestKind) -> bool:
    return "audio" in (kind.payload.get("modalities") or []) or kind.task == "speech"


def _frames(kind: RequestKind) -> int:
    return int(kind.params.get("max_audio_frames", 8 * kind.max_tokens))


def qwen3_omni_items(workload: Workload) -> dict[str, float]:
    """Items per request, averaged over the mix: the thinker one per text token (its prefill included); per spoken
    answer of F frames the talker F + 2 (its prefills), the code predictor 15 per frame (one per code group after
    the talker's), each glue node one per frame, Code2Wav one per 25 frames (its chunk)."""
    total = sum(k.weight for k in workload.kinds)
    out = dict.fromkeys(("thinker", "talker", "code_predictor", "predictor_in", "frame", "talker_in", "code2wav"), 0.0)
    for k in workload.kinds:
        share = k.weight / total
        out["thinker"] += share * k.max_tokens
        if _is_spoken(k):
            frames = _frames(k)
            out["talker"] += share * (frames + 2)
            out["code_predictor"] += share * 15 * frames
            for glue in ("predictor_in", "frame", "talker_in"):
                out[glue] += share * frames
            out["code2wav"] += share * math.ceil(frames / 25)
    return out


def _lm(name: str, weight_bytes: int, itemsize: int, layers: int, hidden: int, heads: int, head_dim: int,
        kv_per_token: int, vocab: int, context: float, tokens_per_item: float, experts: int = 0, topk: int = 0,
        expert_inner: int = 0) -> UnitShape:
    """A decoder LM: its experts' weights apart, attention FLOPs over ``context`` tokens."""
    expert_bytes = layers * experts * 3 * hidden * expert_inner * itemsize
    dense_params = (weight_bytes - expert_bytes) / itemsize - vocab * hidden  # the embedding is a lookup
    active = dense_params + layers * topk * 3 * hidden * expert_inner
    attention = 4 * layers * heads * head_dim * context
    return UnitShape(name, weight_bytes - expert_bytes, expert_bytes, topk / experts if experts else 0.0,
                     2 * active + attention, tokens_per_item, context * kv_per_token)


def qwen3_omni_shapes(model: Model, workload: Workload) -> tuple[list[UnitShape], dict[str, float]]:
    from walkserve.models.common.safetensors_files import DTYPE_ITEMSIZE

    items = qwen3_omni_items(workload)
    comps, c, s = model.components(), model.config, model.speech
    t = c.text
    size = DTYPE_ITEMSIZE[c.dtype]
    answer = max((k.max_tokens for k in workload.kinds), default=32)
    shapes = [_lm("thinker", comps["thinker"].weight_bytes, size, t.num_hidden_layers, t.hidden_size,
                  t.num_attention_heads, t.head_dim, model.kv_bytes_per_token(), t.vocab_size,
                  PROMPT_TOKENS + answer / 2, 1 + PROMPT_TOKENS / max(1.0, items["thinker"]),
                  t.num_experts, t.num_experts_per_tok, t.moe_intermediate_size)]
    if s is None or not items["talker"]:
        return shapes, items
    tk, cp = s.talker, s.code_predictor.attention
    frames = max(_frames(k) for k in workload.kinds if _is_spoken(k))
    talker_kv = 2 * tk.num_hidden_layers * tk.num_key_value_heads * tk.head_dim * size
    shapes.append(_lm("talker", comps["talker"].weight_bytes, size, tk.num_hidden_layers, tk.hidden_size,
                      tk.num_attention_heads, tk.head_dim, talker_kv, tk.vocab_size, PROMPT_TOKENS + frames / 2,
                      1 + PROMPT_TOKENS / max(1.0, items["talker"]), tk.num_experts, tk.num_experts_per_tok,
                      tk.moe_intermediate_size))
    cp_kv = 2 * cp.num_hidden_layers * cp.num_key_value_heads * cp.head_dim * size
    # one step per code group, each reading one of the 15 heads and code tables: the layers' weights plus one head
    cp_bytes = comps["code_predictor"].weight_bytes * 0.6
    shapes.append(UnitShape("code_predictor", cp_bytes, flops_per_token=2 * cp_bytes / size + 4 * cp.num_hidden_layers
                            * cp.num_attention_heads * cp.head_dim * 8, kv_bytes_per_item=8 * cp_kv))
    for glue in ("predictor_in", "frame", "talker_in"):
        shapes.append(UnitShape(glue, 0.0))  # embedding lookups and sums: a launch each
    # Code2Wav: a chunk is 25 new frames after 25 of context; its upsampling decoder re-applies its kernels at
    # up to 1,920 output samples per frame: ~500 x 2 x its parameters per frame (a rough count)
    w = comps["code2wav"].weight_bytes / 4  # loaded in float32
    shapes.append(UnitShape("code2wav", comps["code2wav"].weight_bytes, flops_per_token=2 * w * 500, tokens_per_item=50))
    return shapes, items


# ---- BAGEL ----------------------------------------------------------------------------------
VIT_TOKENS = 70 * 70  # an understood image at the ViT's largest size (980 px a side, 14 px patches)


def _steps(kind: RequestKind) -> int:
    return int(kind.params.get("num_timesteps", 50)) - 1  # Euler steps


def _generates(kind: RequestKind) -> bool:
    return kind.task in ("image", "generate")


def bagel_items(workload: Workload, rows: int) -> tuple[dict[str, float], float]:
    """(items per request, the LLM's mean tokens per item). A generation (``rows`` query rows per pass): the
    LLM's four prefills (system and prompt, into gen and cfg_img) and three passes per Euler step (gen,
    cfg_text, cfg_img; the CFG interval is not modelled), a velocity per pass and a CFG step per Euler step,
    one latent init and one VAE decode. An understanding: one ViT pass, the LLM's system, image and text
    prefills and one item per answer token."""
    total = sum(k.weight for k in workload.kinds)
    names = ("lm", "vit", "latent_init", "velocity", "velocity_cfg_text", "velocity_cfg_img", "cfg_step", "vae_decoder")
    out, tokens = dict.fromkeys(names, 0.0), 0.0
    for k in workload.kinds:
        share = k.weight / total
        if _generates(k):
            steps = _steps(k)
            out["lm"] += share * (4 + 3 * steps)
            tokens += share * (4 * PROMPT_TOKENS / 2 + 3 * steps * rows)
            for n in ("velocity", "velocity_cfg_text", "velocity_cfg_img", "cfg_step"):
                out[n] += share * steps
            out["latent_init"] += share
            out["vae_decoder"] += share
        else:
            out["vit"] += share
            out["lm"] += share * (3 + k.max_tokens)
            tokens += share * (PROMPT_TOKENS + VIT_TOKENS + k.max_tokens)
    return out, tokens / max(1e-9, out["lm"])


def bagel_shapes(model: Model, workload: Workload) -> tuple[list[UnitShape], dict[str, float]]:
    from walkserve.models.bagel.config import BagelConfig
    from walkserve.models.bagel.memory import kv_bytes_per_token, parameter_counts, query_rows

    config = BagelConfig.from_dir(model.ref.path)
    llm, comps = config.llm, model.components()
    rows = query_rows(config)
    items, tokens = bagel_items(workload, rows)
    _, active = parameter_counts(model.ref.path)
    context = PROMPT_TOKENS + rows
    lm_bytes = comps["lm"].weight_bytes / 2  # one of the two experts a pass runs (MoT: understanding or generation)
    attention = 4 * llm.num_hidden_layers * llm.num_attention_heads * llm.head_dim * context
    shapes = [UnitShape("lm", lm_bytes, flops_per_token=2 * active + attention, tokens_per_item=tokens,
                        kv_bytes_per_item=context * kv_bytes_per_token(llm))]
    vit = comps["vit"].weight_bytes / 4  # float32 parameters
    shapes.append(UnitShape("vit", comps["vit"].weight_bytes, flops_per_token=2 * vit, tokens_per_item=VIT_TOKENS))
    for n in ("latent_init", "velocity", "velocity_cfg_text", "velocity_cfg_img", "cfg_step"):
        shapes.append(UnitShape(n, 0.0, flops_per_token=2 * 64 * llm.hidden_size, tokens_per_item=rows))
    # the VAE decoder re-applies its kernels at every position of each stage, 128 to 1,024 a side: ~4 x 128^2
    # positions' worth of its parameters per image (a rough count)
    dec = comps["vae_decoder"].weight_bytes / 4
    shapes.append(UnitShape("vae_decoder", comps["vae_decoder"].weight_bytes, flops_per_token=2 * dec * 4 * 128**2))
    return shapes, items


DESCRIBERS = {"qwen3-omni": qwen3_omni_shapes, "bagel": bagel_shapes}


# what the released models serve: answers of realistic length, many at once
RELEASED_WORKLOADS = {
    "bagel": Workload((
        RequestKind("generate", 0.7, "image", {"prompt": "A lighthouse at dawn, number {i}."}, 1,
                    {"num_timesteps": 50}),
        RequestKind("understand", 0.3, "chat", {"messages": [{"role": "user", "content": "Describe the image."}]},
                    128),
    ), 16, "released"),
    "qwen3-omni": Workload((
        RequestKind("spoken", 0.6, "chat", _chat("Tell me about {i}.", True), 64, {"max_audio_frames": 125}),
        RequestKind("text", 0.4, "chat", _chat("Explain {i}.", False), 256),
    ), 32, "released"),
}


def released_model(family: str, root) -> Model:
    """The released model as header-only weights under ``root`` (written once)."""
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model

    if family == "qwen3-omni":
        from walkserve.models.qwen3_omni.release import released_checkpoint
    elif family == "bagel":
        from walkserve.models.bagel.release import released_checkpoint
    else:
        raise ConfigError(f"--shapes released: the released sizes are known for qwen3-omni and bagel, not {family!r}")
    return load_model(ModelRef(family, str(released_checkpoint(root))))
