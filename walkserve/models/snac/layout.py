"""Where each module of our SnacDecoder lives in an official SNAC checkpoint (torch-free).

The official state dict follows the ``snac`` package's module tree: the
decoder is one ``nn.Sequential`` (``decoder.model.<i>``) whose indices shift
with ``depthwise``, ``attn_window_size`` and ``noise``. Our modules have names
(``stem``, ``attn``, ``blocks.<j>.up`` ...); this table is the one place that
knows how the two line up::

    ours                              official (24 kHz: depthwise, noise, no attention)
    quantizer.levels.<l>.codebook     quantizer.quantizers.<l>.codebook
    quantizer.levels.<l>.out_proj     quantizer.quantizers.<l>.out_proj          (weight-norm)
    stem.0, stem.1                    decoder.model.0, decoder.model.1           (weight-norm)
    attn.{norm,to_qkv,to_out}         decoder.model.<k>.{...}                    (when attention)
    blocks.<j>.snake                  decoder.model.<k+j>.block.0
    blocks.<j>.up                     decoder.model.<k+j>.block.1                (weight-norm)
    blocks.<j>.noise.linear           decoder.model.<k+j>.block.2.linear         (weight-norm)
    blocks.<j>.res.<u>.snake1|conv1|snake2|conv2
                                      decoder.model.<k+j>.block.<3+u>.block.0|1|2|3
    out_snake, out_conv               decoder.model.<m>, decoder.model.<m+1>     (weight-norm)

A weight-normalised convolution stores its ``weight`` as a magnitude ``g``
(shape ``[out, 1, 1]``) and a direction ``v`` (the weight's shape), under
either spelling PyTorch has used; both are read.
"""

from __future__ import annotations

from dataclasses import dataclass

from walkserve.models.snac.config import SnacConfig

# (g, v) suffixes of a weight-normalised ``weight``: torch.nn.utils.parametrizations (what the
# snac package writes), then the older torch.nn.utils.weight_norm spelling.
WEIGHT_NORM_SUFFIXES = (
    (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
    (".weight_g", ".weight_v"),
)


@dataclass(frozen=True)
class Slot:
    """An official module path, and whether its ``weight`` is stored weight-normalised."""

    official: str
    weight_norm: bool = False


def _residual_slots(ours: str, official: str) -> dict[str, Slot]:
    return {
        f"{ours}.snake1": Slot(f"{official}.block.0"),
        f"{ours}.conv1": Slot(f"{official}.block.1", True),
        f"{ours}.snake2": Slot(f"{official}.block.2"),
        f"{ours}.conv2": Slot(f"{official}.block.3", True),
    }


def _block_slots(cfg: SnacConfig, j: int, official: str) -> dict[str, Slot]:
    slots = {
        f"blocks.{j}.snake": Slot(f"{official}.block.0"),
        f"blocks.{j}.up": Slot(f"{official}.block.1", True),
    }
    first_unit = 2
    if cfg.noise:
        slots[f"blocks.{j}.noise.linear"] = Slot(f"{official}.block.2.linear", True)
        first_unit = 3
    for u in range(3):
        slots.update(_residual_slots(f"blocks.{j}.res.{u}", f"{official}.block.{first_unit + u}"))
    return slots


def attention_index(cfg: SnacConfig) -> int:
    """Index of the attention layer (or where it would be) in ``decoder.model``."""
    return 2 if cfg.depthwise else 1


def decoder_slots(cfg: SnacConfig) -> dict[str, Slot]:
    """Our module path -> its official slot, for every parameterised module of the decoder."""
    slots: dict[str, Slot] = {}
    for level in range(cfg.n_levels):
        slots[f"quantizer.levels.{level}.codebook"] = Slot(f"quantizer.quantizers.{level}.codebook")
        slots[f"quantizer.levels.{level}.out_proj"] = Slot(
            f"quantizer.quantizers.{level}.out_proj", True
        )
    index = attention_index(cfg)
    for i in range(index):
        slots[f"stem.{i}"] = Slot(f"decoder.model.{i}", True)
    if cfg.attn_window_size is not None:
        for name in ("norm", "to_qkv", "to_out"):
            slots[f"attn.{name}"] = Slot(f"decoder.model.{index}.{name}")
        index += 1
    for j in range(len(cfg.decoder_rates)):
        slots.update(_block_slots(cfg, j, f"decoder.model.{index + j}"))
    index += len(cfg.decoder_rates)
    slots["out_snake"] = Slot(f"decoder.model.{index}")
    slots["out_conv"] = Slot(f"decoder.model.{index + 1}", True)
    return slots
