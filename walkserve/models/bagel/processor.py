"""BagelProcessor: image generation, editing and understanding requests for BAGEL (torch-free, API process).

    task "image"     {"prompt", "images"?: [uint8 HWC], "noise"?, "modalities"?}   text-to-image, or an edit of
                     the one image (``/v1/images/generations``, ``/v1/images/edits``, ``/v1/generate`` task image)
    task "chat"      {"messages": [...]}: understanding; images first, then the texts joined by newlines
    task "generate"  {"inputs": {"prompt", "image"? | "images"?, "noise"?}, "modalities"}: understanding when
                     the modalities are ["text"], else generation (an edit with an image)

Parameters (``BagelImageParams``) take the task's defaults (``params.py``);
the request carries the inputs and resolved parameters the state machine
reads (``machine.py``). Understanding decodes greedily by default, at most
``max_tokens`` (default 512, the app's) tokens, stopping at ``<|im_end|>``;
a think plan likewise, default 1024.
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path
from typing import Any

from walkserve.core.errors import InvalidRequest
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import MAX_SEED, SamplingParams
from walkserve.models.bagel.config import BagelConfig
from walkserve.models.bagel.graph import MAX_IMAGES
from walkserve.models.bagel.inputs import (
    ImageRules,
    chat_content,
    edit_images,
    initial_noise,
    understanding_image,
)
from walkserve.models.bagel.layout import (
    GEN_THINK_SYSTEM_PROMPT,
    VLM_THINK_SYSTEM_PROMPT,
    SpecialTokens,
)
from walkserve.models.bagel.machine import FLOW_EDIT, FLOW_T2I, FLOW_UND, LATENT_PATCH_PX, ints
from walkserve.models.bagel.memory import parameter_counts
from walkserve.models.bagel.params import (
    EDIT,
    GENERATE,
    BagelImageParams,
    BagelRun,
    ImageLimits,
)
from walkserve.models.common.config_files import RANDOM_WEIGHTS_KEY
from walkserve.models.processor import ModelCard, TokenizedProcessor
from walkserve.models.tokenizer import Tokenizer

UNDERSTAND_MAX_TOKENS = 512  # the app's
THINK_MAX_TOKENS = 1024
IMAGE_MODALITIES = ("image", "latent", "preview", "text")  # text: a think plan's tokens; preview: each step decoded


class BagelProcessor(TokenizedProcessor):
    params_type = BagelImageParams

    def __init__(self, path: str | Path, model_id: str | None = None):
        path = Path(path)
        self.config = BagelConfig.from_dir(path)
        self.tokenizer = Tokenizer.from_dir(path)
        self.tokens = SpecialTokens.from_tokenizer(self.tokenizer)
        self.rules = ImageRules.of(self.config)
        self.limits = ImageLimits(max_side=self.config.max_image_side)
        self.max_context = self.config.llm.max_position_embeddings
        self._card = ModelCard(
            id=model_id or path.name,
            family="bagel",
            capabilities=frozenset({"images", "image_edit", "chat", "image_in", "generate"}),
            max_context=self.max_context,
            random_weights=_random_weights(path),
            description=_description(path, self.config),
            default_sampling={"temperature": 0.0},  # greedy, as the app; max_tokens per task below
        )

    def card(self) -> ModelCard:
        return self._card

    def build_request(self, task: str, payload: dict[str, Any], sampling: SamplingParams,
                      params: BagelImageParams) -> RequestSpec:
        options = params
        if task == "image":
            return self._image(payload, sampling, options, "")
        if task == "chat":
            images, texts = chat_content(payload.get("messages"))
            return self._understanding(images, "\n".join(texts), sampling, options, "messages")
        if task == "generate":
            return self._generate(payload, sampling, options)
        raise InvalidRequest(f"{self._card.id} serves images, edits and understanding, not task {task!r}", param="task")

    # ---- generation and edit -------------------------------------------------------------------
    def _image(self, payload: dict[str, Any], sampling: SamplingParams, options: BagelImageParams,
               where: str) -> RequestSpec:
        images = payload.get("images") or ([payload["image"]] if payload.get("image") is not None else [])
        if len(images) > 1:
            raise InvalidRequest("BAGEL edits one image at a time", param=f"{where}image")
        if payload.get("mask") is not None:
            raise InvalidRequest("BAGEL edits the whole image from the prompt; it takes no mask", param=f"{where}mask")
        flow = FLOW_EDIT if images else FLOW_T2I
        settings = options.resolve(EDIT if images else GENERATE, self.limits)
        inputs: dict[str, Any] = {"prompt_token_ids": ints(self._prompt(payload.get("prompt"), f"{where}prompt"))}
        if images:
            inputs["vae_image"], inputs["vit_image"] = edit_images(images[0], self.rules, f"{where}image")
            height, width = inputs["vae_image"].shape[:2]
        else:
            width, height = settings.size
        params = BagelRun(flow=flow, height=height, width=width, **_settings_params(settings))
        seed = sampling.seed if sampling.seed is not None else secrets.randbelow(MAX_SEED + 1)
        inputs["seed"], inputs["vae_seed"] = seed, (seed + 1) % (MAX_SEED + 1)
        if payload.get("noise") is not None:
            tokens = (height // LATENT_PATCH_PX) * (width // LATENT_PATCH_PX)
            inputs["noise"] = initial_noise(payload["noise"], tokens, self.config.latent_dim, f"{where}noise")
        if settings.think:
            inputs["system_token_ids"] = ints(self.tokenize(GEN_THINK_SYSTEM_PROMPT))
        modalities = self._image_modalities(payload.get("modalities"))
        plan = (sampling.max_tokens or THINK_MAX_TOKENS) if settings.think else 1  # the think plan's bound
        self.fit_max_tokens(self._context_tokens(inputs, 0), self.max_context, plan, f"{where}prompt")
        sampling = dataclasses.replace(sampling, max_tokens=plan, stop_token_ids=(self.tokens.im_end,),
                                       ignore_eos=False)
        return RequestSpec(inputs, task="image", modalities=modalities, sampling=sampling, params=params)

    @staticmethod
    def _image_modalities(value: Any) -> tuple[str, ...]:
        wanted = tuple(value or ("image",))
        bad = [m for m in wanted if m not in IMAGE_MODALITIES]
        if bad:
            raise InvalidRequest(f"BAGEL generates {', '.join(IMAGE_MODALITIES)}, not {bad[0]!r}", param="modalities")
        return wanted if {"image", "latent"} & set(wanted) else (*wanted, "image")

    # ---- understanding -------------------------------------------------------------------------
    def _understanding(self, images: list[tuple[Any, str]], text: str, sampling: SamplingParams,
                       options: BagelImageParams, field: str) -> RequestSpec:
        if len(images) > MAX_IMAGES:
            raise InvalidRequest(f"{len(images)} images; BAGEL reads at most {MAX_IMAGES} per request", param=field)
        inputs: dict[str, Any] = {"prompt_token_ids": ints(self._prompt(text, field))}
        for i, (image, param) in enumerate(images):
            inputs[f"vit_image_{i}"] = understanding_image(image, self.rules, param)
        if options.think:
            inputs["system_token_ids"] = ints(self.tokenize(VLM_THINK_SYSTEM_PROMPT))
        context = self._context_tokens(inputs, len(images))
        max_tokens = self.fit_max_tokens(context, self.max_context, sampling.max_tokens, field)
        if sampling.max_tokens is None:
            max_tokens = min(max_tokens, THINK_MAX_TOKENS if options.think else UNDERSTAND_MAX_TOKENS)
        stop = () if sampling.ignore_eos else (self.tokens.im_end,)  # ignore_eos: exactly max_tokens tokens
        sampling = dataclasses.replace(sampling, max_tokens=max_tokens, stop_token_ids=stop)
        return RequestSpec(inputs, task="chat", modalities=("text",), sampling=sampling,
                           params=BagelRun(flow=FLOW_UND, think=options.think))

    def _generate(self, payload: dict[str, Any], sampling: SamplingParams, options: BagelImageParams) -> RequestSpec:
        inputs = payload.get("inputs")
        if not isinstance(inputs, dict):
            raise InvalidRequest("inputs must be an object with a prompt", param="inputs")
        unknown = sorted(set(inputs) - {"prompt", "image", "images", "noise"})
        if unknown:
            raise InvalidRequest(f"BAGEL takes inputs prompt, image, images and noise, not {unknown[0]!r}",
                                 param=f"inputs.{unknown[0]}")
        modalities = list(payload.get("modalities") or ["text"])
        if modalities == ["text"]:
            images = inputs.get("images") or ([inputs["image"]] if inputs.get("image") is not None else [])
            images = [(image, f"inputs.images[{i}]") for i, image in enumerate(images)]
            return self._understanding(images, str(inputs.get("prompt") or ""), sampling, options, "inputs.prompt")
        return self._image({**inputs, "modalities": modalities}, sampling, options, "inputs.")

    # ---- shared --------------------------------------------------------------------------------
    def _prompt(self, text: Any, param: str) -> list[int]:
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("a non-empty prompt is required", param=param)
        self.check_text_fits(text, self.max_context, param)
        return self.tokenize(text)

    @staticmethod
    def _context_tokens(inputs: dict[str, Any], images: int) -> int:
        """Positions the prefix takes in gen: two markers and one position per text, one per image block."""
        texts = sum(inputs[k].numel + 2 for k in ("system_token_ids", "prompt_token_ids") if k in inputs)
        blocks = images + ("vae_image" in inputs) + ("vit_image" in inputs)
        return texts + blocks + 1  # + the decode's <|im_start|>


def _settings_params(settings: Any) -> dict[str, Any]:
    fields = dataclasses.asdict(settings)
    fields.pop("size")
    return fields


def _description(path: Path, config: BagelConfig) -> str:
    total, active = parameter_counts(path)
    return (f"BAGEL MoT: {config.llm.num_hidden_layers} layers, two experts; {total / 1e9:.2f}B parameters, "
            f"{active / 1e9:.2f}B active per token in the LLM")


def _random_weights(path: Path) -> bool:
    import json

    try:
        return bool(json.loads((path / "config.json").read_text()).get(RANDOM_WEIGHTS_KEY))
    except (OSError, ValueError):
        return False

