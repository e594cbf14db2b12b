"""BAGEL's sequence layout as plain bookkeeping: which tokens go into which context, at which positions.

One request keeps up to three named contexts in the KV pool, each with a
cursor (``kv_len`` tokens cached, next rope ``position``):

    gen       everything: [system] [image blocks] text [think plan]
    cfg_text  a fork of gen taken just before each text and again after each image (so it lacks the last text)
    cfg_img   the system prompt and the texts, never an image

Blocks and positions (p = the context's position before the block):

    text      <|im_start|> t1 .. tn <|im_end|>    causal           positions p .. p+n+1      position += n + 2
    image     <|vision_start|> N rows <|vision_end|>  full (bidirectional inside, sees the prefix)
                                                  all N + 2 at p    position += 1, kv_len += N + 2
    query     [start, N latents, end] at p, full over the context + itself, never written (denoising)

An op says what one model call does to one context (``Append``, ``Query``,
``Fork``, ``Drop``); ``SequenceLayout`` advances the cursors as ops are made
and the ``plan_*`` functions build a flow's ops in the release's order.
Torch-free: the offline loop runs these ops over dense caches, the engine
over its paged pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

GEN, CFG_TEXT, CFG_IMG = "gen", "cfg_text", "cfg_img"
THINK = "think"  # the copy of gen a think-mode plan is decoded on
TEXT, VIT, VAE, LATENTS = "text", "vit", "vae", "latents"  # segment kinds
EXPERT_UND, EXPERT_GEN = 0, 1

GEN_THINK_SYSTEM_PROMPT = (
    "You should first think about the planning process in the mind and then generate the image. \n"
    "The planning process is enclosed within <think> </think> tags, i.e. <think> planning process here </think> "
    "image here"
)
VLM_THINK_SYSTEM_PROMPT = (
    "You should first think about the reasoning process in the mind and then provide the user with the answer. \n"
    "The reasoning process is enclosed within <think> </think> tags, i.e. <think> reasoning process here </think> "
    "answer here"
)


@dataclass(frozen=True)
class SpecialTokens:
    """The four ids the layout places: BOS/EOS of a text segment and the image block markers."""

    im_start: int
    im_end: int
    vision_start: int
    vision_end: int

    @staticmethod
    def from_tokenizer(tokenizer: Any) -> SpecialTokens:
        """From a ``walkserve.models.tokenizer.Tokenizer`` (``token_id`` by text)."""
        names = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>")
        ids = [tokenizer.token_id(n) for n in names]
        missing = [n for n, i in zip(names, ids) if i is None]
        if missing:
            from walkserve.core.errors import ConfigError

            raise ConfigError(f"the tokenizer lacks BAGEL's special token(s) {', '.join(missing)}")
        return SpecialTokens(*ids)


@dataclass(frozen=True)
class Segment:
    """The rows of one append or query.

    ``text``: ``ids`` are every token. ``vit`` / ``vae`` / ``latents``:
    ``ids`` are the two markers (vision_start, vision_end) and the
    ``image_tokens`` rows between them come from an encoder (ViT, or latent
    embeddings of clean VAE latents / of the noisy latents being denoised).
    """

    kind: str
    ids: tuple[int, ...]
    image_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.ids) + self.image_tokens

    @property
    def shared_position(self) -> bool:
        return self.kind != TEXT

    def expert(self) -> list[int]:
        """The expert of every row: latent rows take the generation expert, everything else understanding."""
        if self.kind in (VAE, LATENTS):
            return [EXPERT_UND] + [EXPERT_GEN] * self.image_tokens + [EXPERT_UND]
        return [EXPERT_UND] * self.num_tokens

    def token_ids(self) -> list[int]:
        """Ids of every row; encoder rows hold the start marker's id (their embeddings replace it)."""
        if self.kind == TEXT:
            return list(self.ids)
        return [self.ids[0]] * (1 + self.image_tokens) + [self.ids[1]]


@dataclass(frozen=True)
class Append:
    """Write ``segment`` into ``context`` after ``kv_start`` cached tokens and attend (causal text, full images)."""

    context: str
    segment: Segment
    kv_start: int
    position: int

    @property
    def mask(self) -> str:
        return "full" if self.segment.shared_position else "causal"

    def positions(self) -> list[int]:
        n = self.segment.num_tokens
        return [self.position] * n if self.segment.shared_position else list(range(self.position, self.position + n))


@dataclass(frozen=True)
class Query:
    """Attend ``segment`` over ``context`` (``kv_len`` cached tokens) and itself, fully; write nothing."""

    context: str
    segment: Segment
    kv_len: int
    position: int
    mask: str = "full"

    def positions(self) -> list[int]:
        return [self.position] * self.segment.num_tokens


@dataclass(frozen=True)
class Fork:
    """``target`` becomes a copy-on-write snapshot of ``source`` (a previous ``target`` is dropped)."""

    source: str
    target: str


@dataclass(frozen=True)
class Drop:
    context: str


Op = Append | Query | Fork | Drop


@dataclass
class Cursor:
    kv_len: int = 0
    position: int = 0


@dataclass
class SequenceLayout:
    """The cursors of one request's contexts; each method returns the op and advances what it writes."""

    tokens: SpecialTokens
    cursors: dict[str, Cursor] = field(default_factory=dict)

    def cursor(self, context: str) -> Cursor:
        """The context's cursor (a context never written is empty: kv_len 0, position 0)."""
        return self.cursors.setdefault(context, Cursor())

    def text(self, context: str, ids: Sequence[int]) -> Append:
        """A text segment: <|im_start|> ids <|im_end|>."""
        return self.tokens_append(context, [self.tokens.im_start, *ids, self.tokens.im_end])

    def tokens_append(self, context: str, ids: Sequence[int]) -> Append:
        """Causal tokens as they are (a decode step feeds one)."""
        return self._append(context, Segment(TEXT, tuple(int(i) for i in ids)))

    def image(self, context: str, kind: str, image_tokens: int) -> Append:
        """An image block of ``image_tokens`` ViT (``vit``) or clean-latent (``vae``) rows."""
        if kind not in (VIT, VAE):
            raise ValueError(f"an image block is {VIT!r} or {VAE!r}, not {kind!r}")
        return self._append(context, self._image_segment(kind, image_tokens))

    def query(self, context: str, image_tokens: int) -> Query:
        """The denoising query [start, latents, end] at the context's position."""
        c = self.cursor(context)
        return Query(context, self._image_segment(LATENTS, image_tokens), c.kv_len, c.position)

    def fork(self, source: str, target: str) -> Fork:
        src = self.cursor(source)
        self.cursors[target] = Cursor(src.kv_len, src.position)
        return Fork(source, target)

    def drop(self, context: str) -> Drop:
        self.cursors.pop(context, None)
        return Drop(context)

    def _image_segment(self, kind: str, image_tokens: int) -> Segment:
        return Segment(kind, (self.tokens.vision_start, self.tokens.vision_end), image_tokens)

    def _append(self, context: str, segment: Segment) -> Append:
        c = self.cursor(context)
        op = Append(context, segment, c.kv_len, c.position)
        c.kv_len += segment.num_tokens
        c.position += 1 if segment.shared_position else segment.num_tokens
        return op


@dataclass(frozen=True)
class TextInput:
    ids: tuple[int, ...]


@dataclass(frozen=True)
class ImageInput:
    """An input image's token counts: ``vae_tokens`` clean latent tokens, ``vit_tokens`` ViT patches."""

    vae_tokens: int
    vit_tokens: int


Input = TextInput | ImageInput


def plan_generation_prefill(layout: SequenceLayout, inputs: Sequence[Input],
                            system_ids: Sequence[int] | None = None) -> list[Op]:
    """Text-to-image and edit: the three contexts, as the release's interleaved inferencer fills them.

    ``system_ids`` (think mode) go to gen and cfg_img. Each text: fork gen ->
    cfg_text, then the text into gen and cfg_img. Each image: its VAE block
    and then its ViT block into gen, then fork gen -> cfg_text.
    """
    ops: list[Op] = []
    if system_ids is not None:
        ops += [layout.text(GEN, system_ids), layout.text(CFG_IMG, system_ids)]
    for item in inputs:
        if isinstance(item, TextInput):
            ops += [layout.fork(GEN, CFG_TEXT), layout.text(GEN, item.ids), layout.text(CFG_IMG, item.ids)]
        else:
            ops += [layout.image(GEN, VAE, item.vae_tokens), layout.image(GEN, VIT, item.vit_tokens),
                    layout.fork(GEN, CFG_TEXT)]
    return ops


def plan_understanding_prefill(layout: SequenceLayout, inputs: Sequence[Input],
                               system_ids: Sequence[int] | None = None) -> list[Op]:
    """Understanding: only gen, images as ViT blocks only (no VAE), then the texts."""
    ops: list[Op] = [] if system_ids is None else [layout.text(GEN, system_ids)]
    for item in inputs:
        if isinstance(item, TextInput):
            ops.append(layout.text(GEN, item.ids))
        else:
            ops.append(layout.image(GEN, VIT, item.vit_tokens))
    return ops


def plan_denoise_step(layout: SequenceLayout, image_tokens: int, cfg_text: bool, cfg_img: bool) -> list[Query]:
    """One flow step's queries: gen always, cfg_text / cfg_img when their branch is used at this step."""
    contexts = [GEN] + [CFG_TEXT] * cfg_text + [CFG_IMG] * cfg_img
    return [layout.query(c, image_tokens) for c in contexts]


def plan_think_start(layout: SequenceLayout) -> list[Op]:
    """Think mode: the plan is decoded on a copy of gen (its first input is <|im_start|>, see ``decode_start``)."""
    return [layout.fork(GEN, THINK)]


def plan_think_end(layout: SequenceLayout, plan_ids: Sequence[int]) -> list[Op]:
    """Drop the copy, then the decoded plan re-enters gen (only gen) as a text segment."""
    return [layout.drop(THINK), layout.text(GEN, plan_ids)]


def decode_start(layout: SequenceLayout, context: str) -> Append:
    """The first decode input: <|im_start|> at the context's position."""
    return layout.tokens_append(context, [layout.tokens.im_start])
