"""BAGEL's walks (torch-free): each one KV-context step of the layout, and the flow loop.

Every LLM node runs the one ``lm`` component; its name says which context it
writes or reads, so a placement can put each context's passes on its own rank:

    lm            gen        appends (texts, image blocks, decode, the think plan), the gen query
    lm_cfg_img    cfg_img    appends (the system prompt and texts), the cfg_img query
    lm_cfg_text   cfg_text   the cfg_text query (the context itself is a fork of gen, taken by ``lm``)

Walks (the state machine, ``machine.py``, picks them per task):

    prefill_text      lm: fork gen -> cfg_text, append the text to gen   lm_cfg_img: append it to cfg_img
    prefill_system    lm: append to gen                                  lm_cfg_img: append to cfg_img
    prefill_text_gen  lm: append to gen only (understanding; ``_2`` for a second text)
    prefill_vit       vit(image) -> lm: append the ViT block to gen (full mask, one position; ``_2``.. per image)
    prefill_vit_edit  the same for an edit's input image
    prefill_vae       vae_encoder(image, seed) -> latent_embed (t = 0) -> lm: append the VAE block to gen
    decode            DynamicLoop[ lm: append the token to gen ] from <|im_start|>, tokens to the client
    think             the same loop; the plan's ids come out
    image_gen         [lm_plan: truncate gen to before the plan, append it as a text block (``_think``)]
                      latent_init(noise | seed) -> Loop[ num_timesteps - 1 ]:
                          lm / lm_cfg_text / lm_cfg_img: query [start, latents, end] -> hidden    (one stage:
                          velocity / velocity_cfg_text / velocity_cfg_img: llm2vae               one forward)
                          cfg_step: CFG + renorm + Euler, and the next step's latent embeddings
                      -> output.latents (the last x); ``..._latents`` also streams every x,
                      ``..._previews`` every x decoded by ``preview`` (vae_decoder) after cfg_step
    vae_decode        vae_decoder(latents) -> client: image

The three passes of a step do not depend on each other, so a loop cohort runs
them (for every request in the loop) as one KV-engine call, one forward.

``cfg_parallel`` (the ``bagel-cfg-parallel`` placement: each context on its own rank) writes every
context by its own node, so no context is read on a rank other than the one that wrote it:

    prefill_system    lm_cfg_text also appends the system prompt to cfg_text
    prefill_vae       lm_cfg_text also appends the VAE block (the same embeddings and positions)
    prefill_vit_edit  lm_cfg_text also appends the edit image's ViT block
    prefill_text      no fork: cfg_text already holds gen's content but this text

which leaves cfg_text as the fork would (the generation prompt is the last prefill of a generation).
The edit image's ViT block has its own walk (``prefill_vit_edit``) so understanding's ViT blocks
stay on gen alone.
"""

from __future__ import annotations

from walkserve.core.params import RequestParams
from walkserve.graph import (
    ACCUMULATE,
    LAST,
    Client,
    DynamicLoop,
    GraphEdge,
    GraphNode,
    Loop,
    Parallel,
    Sequential,
    StateMachine,
    Walk,
    WalkGraph,
)
from walkserve.graph.kv import ALL, append, fork, kv_params, query, truncate
from walkserve.graph.stop import max_tokens
from walkserve.models.bagel.layout import CFG_IMG, CFG_TEXT, GEN
from walkserve.models.common.text_walk import stop_rule

LM, LM_CFG_TEXT, LM_CFG_IMG = "lm", "lm_cfg_text", "lm_cfg_img"
PASS_NODES = {GEN: LM, CFG_TEXT: LM_CFG_TEXT, CFG_IMG: LM_CFG_IMG}  # context -> the node of its passes
VELOCITY = {GEN: "velocity", CFG_TEXT: "velocity_cfg_text", CFG_IMG: "velocity_cfg_img"}
MAX_IMAGES = 4  # ViT images of one understanding request (one prefill_vit walk each)
MAX_TEXTS = 2  # text segments into gen only (a think system prompt and the question)

PREFILL_TEXT, PREFILL_SYSTEM, PREFILL_TEXT_GEN = "prefill_text", "prefill_system", "prefill_text_gen"
PREFILL_VIT, PREFILL_VAE, PREFILL_VIT_EDIT = "prefill_vit", "prefill_vae", "prefill_vit_edit"
DECODE, THINK = "decode", "think"
IMAGE_GEN, VAE_DECODE = "image_gen", "vae_decode"
PREVIEW = "preview"  # the node decoding each step's x in the ``_previews`` flows


def repeated(kind: str, index: int) -> str:
    """The walk name of the index-th (from 0) walk of one kind in a request: ``prefill_vit``, ``prefill_vit_2``, ..."""
    return kind if index == 0 else f"{kind}_{index + 1}"


def _denoise_steps(params: RequestParams) -> int:
    return params.model.num_timesteps - 1  # BagelRun


# ---- prefill ---------------------------------------------------------------------------------------
def text_walk(name: str, fork_first: bool, also: tuple[str, ...] = ()) -> Walk:
    """A text block appended to gen (after a fork gen -> cfg_text when ``fork_first``) and to each context
    of ``also`` (cfg_img, and cfg_text when it is written by its own node); each takes its running positions."""
    ops = (fork(GEN, into=CFG_TEXT), append(GEN)) if fork_first else (append(GEN),)
    nodes = [GraphNode(LM, ["tokens"], params=kv_params(*ops))]
    nodes += [GraphNode(PASS_NODES[c], ["tokens"], component=LM, params=kv_params(append(c))) for c in also]
    edges = [GraphEdge("input.tokens", f"{n.name}.tokens") for n in nodes]
    return Walk(name, Parallel(*nodes) if len(nodes) > 1 else nodes[0], edges=edges, inputs=["tokens"])


def _block_edges(node: str, slots: tuple[str, ...]) -> list[GraphEdge]:
    return [GraphEdge(f"input.{s}", f"{node}.{s}") for s in slots]


def _blocks(contexts: tuple[str, ...], source: str, slots: tuple[str, ...], **fields) -> tuple[GraphNode | Parallel,
                                                                                                list[GraphEdge]]:
    """The image block appended (full mask) to each of ``contexts`` by its own node, embeddings from ``source``."""
    nodes = [GraphNode(PASS_NODES[c], ["tokens", "embeds", *slots], component=LM,
                       params=kv_params(append(c, mask="full", **fields))) for c in contexts]
    edges = []
    for n in nodes:
        edges.append(GraphEdge(source, f"{n.name}.embeds"))
        edges += _block_edges(n.name, ("tokens", *slots))
    return (Parallel(*nodes) if len(nodes) > 1 else nodes[0]), edges


def vit_walk(name: str, contexts: tuple[str, ...] = (GEN,)) -> Walk:
    """A ViT image block into gen (and cfg_text, written by its own node): [<|vision_start|>, ViT rows,
    <|vision_end|>], full mask, one position."""
    block, edges = _blocks(contexts, "vit.embeds", ("embed_rows", "positions"))
    edges.insert(0, GraphEdge("input.image", "vit.image"))
    body = Sequential(GraphNode("vit", ["image"], ["embeds"]), block)
    return Walk(name, body, edges=edges, inputs=["image", "tokens", "embed_rows", "positions"])


def vae_walk(contexts: tuple[str, ...] = (GEN,)) -> Walk:
    """A VAE image block into gen (and cfg_text): the sampled posterior's clean latents (t = 0), the
    generation expert."""
    block, block_edges = _blocks(contexts, "latent_embed.embeds", ("embed_rows", "positions", "expert"),
                                 token_inputs=("expert",))
    body = Sequential(
        GraphNode("vae_encoder", ["image", "seed"], ["latents"]),
        GraphNode("latent_embed", ["latents", "grid"], ["embeds"], component="latents", op="embed"),
        block,
    )
    edges = [GraphEdge("input.image", "vae_encoder.image"), GraphEdge("input.seed", "vae_encoder.seed"),
             GraphEdge("vae_encoder.latents", "latent_embed.latents"), GraphEdge("input.grid", "latent_embed.grid"),
             *block_edges]
    return Walk(PREFILL_VAE, body, edges=edges,
                inputs=["image", "seed", "grid", "tokens", "embed_rows", "positions", "expert"])


# ---- decode ----------------------------------------------------------------------------------------
def _decode_loop(name: str) -> DynamicLoop:
    node = GraphNode(LM, ["tokens"], ["token"], params=kv_params(append(GEN)))
    return DynamicLoop(node, stop=stop_rule(), max_iterations=max_tokens, carry={f"{LM}.token": f"{LM}.tokens"},
                       outputs={f"{LM}.token": ACCUMULATE}, name=name)


def decode_walk() -> Walk:
    """Greedy (or sampled) tokens on gen from <|im_start|> until <|im_end|> (not written), to the client."""
    edges = [GraphEdge("input.start", f"{LM}.tokens"), GraphEdge(f"{LM}.token", Client("text"))]
    return Walk(DECODE, _decode_loop("decode_loop"), edges=edges, inputs=["start"])


def think_walk() -> Walk:
    """The think plan, decoded on gen from <|im_start|>; its ids come out (``image_gen_think`` then rolls gen
    back and prefills the plan as a text block, as the release re-prefills it)."""
    edges = [GraphEdge("input.start", f"{LM}.tokens"), GraphEdge(f"{LM}.token", Client("text")),
             GraphEdge(f"{LM}.token", "output.plan")]
    return Walk(THINK, _decode_loop("think_loop"), edges=edges, inputs=["start"], outputs=["plan"])


# ---- the flow loop ---------------------------------------------------------------------------------
def _pass(context: str) -> tuple[GraphNode, GraphNode]:
    """One guidance pass: the query over ``context`` and the velocity of its latent rows."""
    lm = GraphNode(PASS_NODES[context], ["tokens", "embeds", "embed_rows", "positions", "expert"], ["hidden"],
                   component=LM, params=kv_params(query(context, mask="full", rows=ALL, token_inputs=("expert",))))
    vel = GraphNode(VELOCITY[context], ["hidden"], ["velocity"], component="latents", op="velocity")
    return lm, vel


def image_gen_walk(stream: bool, think: bool, previews: bool = False) -> Walk:
    """``num_timesteps - 1`` flow steps from the noise, each querying the three contexts; the last x out.

    With ``think``, ``lm_plan`` first rolls gen back to before the decoded plan (``plan_length`` tokens) and
    appends the plan's text block (``plan_tokens``); the flow starts once it is in. ``stream`` sends every
    step's x to the client, ``previews`` every step's x decoded (node ``preview``, an image per step)."""
    passes = {c: _pass(c) for c in (GEN, CFG_TEXT, CFG_IMG)}
    step = GraphNode("cfg_step", ["x", "v", "v_cfg_text", "v_cfg_img", "grid"], ["x", "embeds"],
                     component="latents", op="step")
    tail = [GraphNode(PREVIEW, ["latents", "grid"], ["image"], component="vae_decoder")] if previews else []
    body = Sequential(Parallel(*(lm for lm, _ in passes.values())), Parallel(*(v for _, v in passes.values())), step,
                      *tail)
    lm_names = [lm.name for lm, _ in passes.values()]
    loop = Loop(body, iterations=_denoise_steps, name="denoise", outputs={"cfg_step.x": LAST},
                carry={"cfg_step.x": "cfg_step.x", "cfg_step.embeds": [f"{n}.embeds" for n in lm_names]})
    init = GraphNode("latent_init", ["noise", "seed", "grid", *(["after"] if think else [])], ["x", "embeds"],
                     component="latents", op="init")
    edges = [GraphEdge(f"input.{s}", f"latent_init.{s}") for s in ("noise", "seed", "grid")]
    first: list[GraphNode] = [init]
    if think:
        first.insert(0, GraphNode("lm_plan", ["tokens", "length"], ["hidden"], component=LM,
                                  params=kv_params(truncate(GEN, "length"), append(GEN))))
        edges += [GraphEdge("input.plan_tokens", "lm_plan.tokens"), GraphEdge("input.plan_length", "lm_plan.length"),
                  GraphEdge("lm_plan.hidden", "latent_init.after")]
    edges += [GraphEdge("latent_init.x", "cfg_step.x"), GraphEdge("input.grid", "cfg_step.grid")]
    for context, (lm, vel) in passes.items():
        edges.append(GraphEdge("latent_init.embeds", f"{lm.name}.embeds"))
        edges += [GraphEdge(f"input.{s}", f"{lm.name}.{s}") for s in ("tokens", "embed_rows", "expert")]
        edges.append(GraphEdge(f"input.{_positions_input(context)}", f"{lm.name}.positions"))
        edges.append(GraphEdge(f"{lm.name}.hidden", f"{vel.name}.hidden"))
        edges.append(GraphEdge(f"{vel.name}.velocity", "cfg_step." + ("v" if context == GEN else f"v_{context}")))
    edges.append(GraphEdge("cfg_step.x", "output.latents"))
    if stream:
        edges.append(GraphEdge("cfg_step.x", Client("latent")))
    if previews:
        edges += [GraphEdge("cfg_step.x", f"{PREVIEW}.latents"), GraphEdge("input.grid", f"{PREVIEW}.grid"),
                  GraphEdge(f"{PREVIEW}.image", Client("image"))]
    inputs = ["noise", "seed", "grid", "tokens", "embed_rows", "expert", *(_positions_input(c) for c in passes)]
    inputs += ["plan_tokens", "plan_length"] if think else []
    return Walk(image_gen_name(stream, think, previews), Sequential(*first, loop), edges=edges, inputs=inputs,
                outputs=["latents"])


def image_gen_name(stream: bool, think: bool, previews: bool = False) -> str:
    return IMAGE_GEN + ("_think" if think else "") + ("_latents" if stream else "") + ("_previews" if previews else "")


def _positions_input(context: str) -> str:
    return "positions" if context == GEN else f"positions_{context}"


def vae_decode_walk() -> Walk:
    node = GraphNode("vae_decoder", ["latents", "grid"], ["image"])
    edges = [GraphEdge("input.latents", "vae_decoder.latents"), GraphEdge("input.grid", "vae_decoder.grid"),
             GraphEdge("vae_decoder.image", Client("image"))]
    return Walk(VAE_DECODE, node, edges=edges, inputs=["latents", "grid"])


def walks(cfg_parallel: bool = False) -> list[Walk]:
    """Every walk; ``cfg_parallel``: cfg_text written by its own node instead of forked from gen."""
    cfg_text = (CFG_TEXT,) if cfg_parallel else ()
    out = [text_walk(PREFILL_TEXT, fork_first=not cfg_parallel, also=(CFG_IMG,)),
           text_walk(PREFILL_SYSTEM, fork_first=False, also=(*cfg_text, CFG_IMG))]
    out += [text_walk(repeated(PREFILL_TEXT_GEN, i), fork_first=False) for i in range(MAX_TEXTS)]
    out += [vit_walk(repeated(PREFILL_VIT, i)) for i in range(MAX_IMAGES)]
    out += [vit_walk(PREFILL_VIT_EDIT, (GEN, *cfg_text)), vae_walk((GEN, *cfg_text)), decode_walk(), think_walk()]
    out += [image_gen_walk(stream, think, previews) for think in (False, True) for stream in (False, True)
            for previews in (False, True)]
    out.append(vae_decode_walk())
    return out


def build_graph(state_machine: StateMachine, cfg_parallel: bool = False) -> WalkGraph:
    return WalkGraph("bagel", walks(cfg_parallel), state_machine)
