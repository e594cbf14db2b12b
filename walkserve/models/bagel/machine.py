"""BagelMachine: the walks of one request and their inputs, a pure function of the request (torch-free).

The processor writes the request (``RequestSpec``):

    inputs   prompt_token_ids   int64 [n]     the prompt (generation) or the question (understanding)
             system_token_ids   int64 [m]     think mode's system prompt (absent otherwise)
             vae_image          uint8 [H, W, 3]   edit: the VAE-resized input
             vit_image          uint8 [h, w, 3]   edit: that image ViT-resized
             vit_image_<i>      uint8 [h, w, 3]   understanding: image i (i < MAX_IMAGES), ViT-resized
             noise              float32 [N, 64]   optional: the initial latent (else drawn from ``seed``)
             seed, vae_seed     int               the noise's and the VAE posterior's generators
    params   a ``BagelRun``: flow ("text_to_image" | "edit" | "understand"), think, height, width
             (text-to-image), num_timesteps, timestep_shift, cfg_* (``params.ImageSettings``)
    modalities  "image" (decode the final latent), "latent" (stream every step's latent), "preview" (stream
                every step's latent decoded, as images from node ``preview``), any of them together

and the machine replays the layout (``layout.py``) to place every block:

    text-to-image  [prefill_system] prefill_text [think] image_gen vae_decode
    edit           [prefill_system] prefill_vae prefill_vit_edit prefill_text [think] image_gen vae_decode
    understand     [prefill_text_gen] prefill_vit .. prefill_vit_<k> prefill_text_gen[_2] decode

Each walk name occurs once per request, so ``next`` knows where the request
is from the finished walk's name alone; after ``think`` the plan's length
(its output) places the image_gen queries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from walkserve.core.array import ArrayData
from walkserve.core.request import RequestSpec, Value
from walkserve.graph import StateMachine, WalkStart
from walkserve.models.bagel.graph import (
    DECODE,
    MAX_IMAGES,
    PREFILL_SYSTEM,
    PREFILL_TEXT,
    PREFILL_TEXT_GEN,
    PREFILL_VAE,
    PREFILL_VIT,
    PREFILL_VIT_EDIT,
    THINK,
    VAE_DECODE,
    image_gen_name,
    repeated,
)
from walkserve.models.bagel.layout import (
    CFG_IMG,
    CFG_TEXT,
    GEN,
    VAE,
    VIT,
    Append,
    SequenceLayout,
    SpecialTokens,
)
from walkserve.models.bagel.params import BagelRun

FLOW_T2I, FLOW_EDIT, FLOW_UND = "text_to_image", "edit", "understand"
FLOWS = (FLOW_T2I, FLOW_EDIT, FLOW_UND)
LATENT_PATCH_PX = 16  # pixels per latent token side (VAE 8 x patch 2)
VIT_PATCH_PX = 14


def ints(values: Sequence[int]) -> ArrayData:
    return ArrayData.from_list([int(v) for v in values], "int64")


def input_ids(request: RequestSpec, key: str) -> list[int]:
    value = request.inputs.get(key)
    ids = value.tolist() if isinstance(value, ArrayData) else value
    if not isinstance(ids, list):
        raise ValueError(f"request {request.id}: inputs[{key!r}] must be token ids")
    return [int(t) for t in ids]


def image_tokens(image: Value, patch: int) -> tuple[int, int]:
    """(rows, cols) of patches of an HWC image array."""
    if not isinstance(image, ArrayData) or len(image.shape) != 3:
        raise ValueError("an image input must be a uint8 [H, W, 3] array")
    return image.shape[0] // patch, image.shape[1] // patch


class BagelMachine(StateMachine):
    def __init__(self, tokens: SpecialTokens):
        self.tokens = tokens

    def first(self, request: RequestSpec) -> WalkStart:
        return self._starts(request, None)[0]

    def next(self, request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None:
        if finished.startswith("image_gen"):
            if "image" not in request.modalities:
                return None
            return WalkStart(VAE_DECODE, {"latents": outputs["latents"], "grid": ints(self._grid(request))})
        if finished in (DECODE, VAE_DECODE):
            return None
        plan = outputs.get("plan") if finished == THINK else None
        starts = self._starts(request, None if plan is None else _ids(plan))
        names = [s.walk for s in starts]
        return starts[names.index(finished) + 1]

    # ---- the schedule --------------------------------------------------------------------------
    def _starts(self, request: RequestSpec, plan: list[int] | None) -> list[WalkStart]:
        """Every walk up to image_gen (or decode); stops after ``think`` while the plan is unknown."""
        params = request.params
        if not isinstance(params, BagelRun) or params.flow not in FLOWS:
            raise ValueError(f"request {request.id}: params must be a BagelRun with a flow of {', '.join(FLOWS)}, "
                             f"got {params!r}")
        flow = params.flow
        layout = SequenceLayout(self.tokens)
        system = input_ids(request, "system_token_ids") if "system_token_ids" in request.inputs else None
        prompt = input_ids(request, "prompt_token_ids")
        if flow == FLOW_UND:
            return self._understanding(request, layout, system, prompt)
        starts = []
        if system is not None:
            starts.append(self._text(PREFILL_SYSTEM, layout, system, (GEN, CFG_IMG)))
        if flow == FLOW_EDIT:
            starts.append(self._vae_block(request, layout))
            starts.append(self._vit_block(PREFILL_VIT_EDIT, request.inputs["vit_image"], layout))
        layout.fork(GEN, CFG_TEXT)
        starts.append(self._text(PREFILL_TEXT, layout, prompt, (GEN, CFG_IMG)))
        if not params.think:
            return [*starts, self._image_gen(request, layout)]
        starts.append(WalkStart(THINK, {"start": ints([self.tokens.im_start])}))
        if plan is None:
            return starts
        length = layout.cursor(GEN).kv_len  # gen before the plan: image_gen_think rolls it back there
        block = layout.text(GEN, plan)  # and prefills <|im_start|> plan <|im_end|>
        extra = {"plan_tokens": ints(block.segment.token_ids()), "plan_length": ints([length])}
        return [*starts, self._image_gen(request, layout, extra)]

    def _understanding(self, request: RequestSpec, layout: SequenceLayout, system: list[int] | None,
                       prompt: list[int]) -> list[WalkStart]:
        starts, texts = [], 0
        if system is not None:
            starts.append(self._text(repeated(PREFILL_TEXT_GEN, texts), layout, system, (GEN,)))
            texts += 1
        images = [request.inputs[k] for k in (f"vit_image_{i}" for i in range(MAX_IMAGES)) if k in request.inputs]
        for i, image in enumerate(images):
            starts.append(self._vit_block(repeated(PREFILL_VIT, i), image, layout))
        starts.append(self._text(repeated(PREFILL_TEXT_GEN, texts), layout, prompt, (GEN,)))
        starts.append(WalkStart(DECODE, {"start": ints([self.tokens.im_start])}))
        return starts

    @staticmethod
    def _text(walk: str, layout: SequenceLayout, ids: list[int], contexts: tuple[str, ...]) -> WalkStart:
        ops = [layout.text(c, ids) for c in contexts]
        return WalkStart(walk, {"tokens": ints(ops[0].segment.token_ids())})

    @staticmethod
    def _block_inputs(op: Append) -> dict[str, Value]:
        seg = op.segment
        return {"tokens": ints(seg.token_ids()), "embed_rows": ints(range(1, 1 + seg.image_tokens)),
                "positions": ints(op.positions())}

    def _vit_block(self, walk: str, image: Value, layout: SequenceLayout) -> WalkStart:
        rows, cols = image_tokens(image, VIT_PATCH_PX)
        op = layout.image(GEN, VIT, rows * cols)
        return WalkStart(walk, {"image": image, **self._block_inputs(op)})

    def _vae_block(self, request: RequestSpec, layout: SequenceLayout) -> WalkStart:
        image = request.inputs["vae_image"]
        rows, cols = image_tokens(image, LATENT_PATCH_PX)
        op = layout.image(GEN, VAE, rows * cols)
        inputs = {"image": image, "seed": ints([int(request.inputs.get("vae_seed", 0))]), "grid": ints([rows, cols]),
                  "expert": ints(op.segment.expert()), **self._block_inputs(op)}
        return WalkStart(PREFILL_VAE, inputs)

    def _image_gen(self, request: RequestSpec, layout: SequenceLayout,
                   plan: dict[str, Value] | None = None) -> WalkStart:
        rows, cols = self._grid(request)
        queries = {c: layout.query(c, rows * cols) for c in (GEN, CFG_TEXT, CFG_IMG)}
        seg = queries[GEN].segment
        noise = request.inputs.get("noise")
        inputs: dict[str, Value] = {
            "noise": noise if isinstance(noise, ArrayData) else ArrayData("float32", (0,), b""),
            "seed": ints([int(request.inputs.get("seed", 0))]),
            "grid": ints([rows, cols]),
            "tokens": ints(seg.token_ids()),
            "embed_rows": ints(range(1, 1 + seg.image_tokens)),
            "expert": ints(seg.expert()),
            "positions": ints(queries[GEN].positions()),
            "positions_cfg_text": ints(queries[CFG_TEXT].positions()),
            "positions_cfg_img": ints(queries[CFG_IMG].positions()),
            **(plan or {}),
        }
        return WalkStart(image_gen_name("latent" in request.modalities, plan is not None,
                                        "preview" in request.modalities), inputs)

    @staticmethod
    def _grid(request: RequestSpec) -> tuple[int, int]:
        """Latent tokens (rows, cols) of the output: the edited image's, or the requested size's."""
        params = request.params
        assert isinstance(params, BagelRun)
        if params.flow == FLOW_EDIT:
            return image_tokens(request.inputs["vae_image"], LATENT_PATCH_PX)
        return params.height // LATENT_PATCH_PX, params.width // LATENT_PATCH_PX


def _ids(plan: Any) -> list[int]:
    """The think walk's output (int64 [n], or empty when it decoded nothing) as ids."""
    values = plan.tolist() if isinstance(plan, ArrayData) and plan.numel else plan if isinstance(plan, list) else []
    return [int(t) for t in values]
