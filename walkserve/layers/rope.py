"""Rotary position embeddings in the HF "rotate_half" (non-interleaved) convention.

A head vector x of dim Dh is split as [x1 | x2 | rest] with x1, x2 of Dr/2
dims each (Dr = rotary dim, Dh unless ``partial_rotary_factor`` < 1):

    out = [x1 * cos - x2 * sin | x2 * cos + x1 * sin | rest]

with cos/sin of ``position * inv_freq`` ([T, Dr/2]). This is exactly
``x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)`` as in transformers.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from walkserve.layers.rope_config import RopeConfig


def rope_inv_freq(rope: RopeConfig, head_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Inverse frequencies [Dr/2] (float32) for the rope type."""
    dim = rope.rotary_dim(head_dim)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim
    inv_freq = 1.0 / (rope.theta**exponents)  # [Dr/2]
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by ``factor``, blend in between."""
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq  # [Dr/2]
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def mrope_axes(num_freqs: int, section: tuple[int, ...], interleaved: bool) -> list[int]:
    """The position axis of each of ``num_freqs`` rotary frequencies under ``mrope_section``.

    Contiguous (Qwen2-VL): the first section[0] frequencies follow axis 0, the
    next section[1] axis 1, and so on. Interleaved (Qwen3-VL / Qwen3-Omni):
    frequency j follows axis 1 when j % 3 == 1 and j < 3 * section[1], axis 2
    when j % 3 == 2 and j < 3 * section[2], and axis 0 otherwise (so with
    [24, 20, 20] over 64 frequencies, axis 0 keeps 0, 3, ..., 57 and 60..63).
    """
    if sum(section) != num_freqs:
        raise ValueError(f"mrope_section {list(section)} must sum to the {num_freqs} rotary frequencies")
    if not interleaved:
        return [a for a, n in enumerate(section) for _ in range(n)]
    axes = [0] * num_freqs
    for axis in range(1, len(section)):
        for j in range(axis, 3 * section[axis], 3):
            axes[j] = axis
    return axes


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, Dh] with cos/sin [T, Dr/2] (already in x's dtype)."""
    half = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, Dr/2]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    rotated = (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
    return torch.cat((*rotated, rest) if rest.shape[-1] else rotated, dim=-1)  # [T, H, Dh]


class RotaryEmbedding(nn.Module):
    """cos/sin tables for positions, built lazily and grown on demand; applies the rotation to q and k.

    ``positions`` is ``[T]`` (one position per token) or ``[A, T]`` for
    multimodal rope with A position axes; ``cos_sin`` is the only place that
    looks at positions (``multi_axis_cos_sin`` for ``[A, T]``).
    The table holds no parameters and is not part of the checkpoint, which
    lets the model be built on the meta device and materialised by a loader.
    """

    def __init__(self, head_dim: int, rope: RopeConfig, max_positions: int = 4096):
        super().__init__()
        self.head_dim = head_dim
        self.rope = rope
        self.rotary_dim = rope.rotary_dim(head_dim)
        self.max_positions = max_positions
        self._cos: torch.Tensor | None = None  # [P, Dr/2] float32
        self._sin: torch.Tensor | None = None

    def reserve(self, num_positions: int, device: torch.device | str) -> None:
        """Build the table for positions [0, num_positions) on ``device`` now."""
        t = torch.arange(num_positions, dtype=torch.float32, device=device)  # [P]
        freqs = torch.outer(t, rope_inv_freq(self.rope, self.head_dim, device=device))  # [P, Dr/2]
        self._cos, self._sin = freqs.cos(), freqs.sin()

    def reserve_all(self, device: torch.device | str) -> None:
        """Build the whole table (``max_positions``) on ``device`` unless it is there: afterwards no lookup
        looks at positions, so a forward can be captured in a CUDA graph."""
        device = torch.device(device)
        if self._cos is None or self._cos.device != device or self._cos.shape[0] < self.max_positions:
            self.reserve(self.max_positions, device)

    def _table(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The table, grown to cover ``positions``.

        Looking at positions costs a device sync, so it is skipped once the
        table covers ``max_positions`` (call ``reserve`` up front on GPUs).
        """
        have = 0 if self._cos is None or self._cos.device != positions.device else self._cos.shape[0]
        if have < self.max_positions:
            need = int(positions.max()) + 1 if positions.numel() else 1
            if need > have:
                self.reserve(max(need, min(self.max_positions, max(2 * have, 1024))), positions.device)
        return self._cos, self._sin

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos, sin: [T, Dr/2] for positions [T] (or [A, T] for multimodal rope)."""
        if positions.dim() != 1:
            return self.multi_axis_cos_sin(positions)
        cos, sin = self._table(positions)
        return cos[positions], sin[positions]  # [T, Dr/2] each

    def multi_axis_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Multimodal rope: positions [A, T] (integer, or float for fractional video times) -> cos, sin [T, Dr/2].

        Each frequency takes its angle from the axis ``mrope_axes`` assigns it
        (``rope.mrope_section``), so text tokens, whose axes all hold the same
        position, rotate exactly as with 1-D rope. Computed per call (no
        table): T x Dr/2 angles cost less than the lookup's bookkeeping.
        """
        section = self.rope.mrope_section
        if section is None:
            raise NotImplementedError(
                f"positions of shape {tuple(positions.shape)}: multimodal rope needs mrope_section in the "
                f"rope config ({type(self).__name__})"
            )
        inv_freq = rope_inv_freq(self.rope, self.head_dim, device=positions.device)  # [F]
        axes = mrope_axes(inv_freq.shape[0], section, self.rope.mrope_interleaved)
        if max(axes) >= positions.shape[0]:
            raise ValueError(f"mrope_section {list(section)} needs {max(axes) + 1} position axes, got {positions.shape[0]}")
        axis = torch.tensor(axes, device=positions.device)  # [F]
        per_freq = positions.index_select(0, axis).to(torch.float32)  # [F, T]
        freqs = per_freq.t() * inv_freq  # [T, F]
        return freqs.cos(), freqs.sin()

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [T, Hq, Dh] and k [T, Hkv, Dh] for ``positions``."""
        cos, sin = self.cos_sin(positions)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


# ---------------------------------------------------------------------------
# Adjacent-pair rotation with one angle per dim (V-JEPA 2's 3-D RoPE).
#
# The pairs are (x[2i], x[2i+1]) and every dim d carries its own angle, given
# as full-width cos/sin [T, Dh]:
#
#     out = x * cos + swap(x) * sin,   swap(x)[2i] = -x[2i+1],  swap(x)[2i+1] = x[2i]
#
# A dim whose angle is 0 (cos 1, sin 0) passes through unchanged, so several
# rotated parts and an unrotated tail share one call.
# ---------------------------------------------------------------------------


def tiled_angles(positions: torch.Tensor, dim: int, theta: float = 10000.0) -> torch.Tensor:
    """float32 [T, dim] angles ``position * f`` in the *tiled* layout ``[f0 … f(dim/2-1), f0 … f(dim/2-1)]``.

    ``f_i = 1 / theta^(i / (dim/2))``. The tiled layout (not one frequency per
    pair) is what V-JEPA 2's weights were trained with, so the two dims of a
    pair generally turn by different angles.
    """
    half = dim // 2
    inv_freq = 1.0 / theta ** (torch.arange(half, dtype=torch.float32, device=positions.device) / half)  # [dim/2]
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, dim/2]
    return torch.cat([freqs, freqs], dim=-1)  # [T, dim]


def apply_rotary_adjacent(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of x [..., T, H, Dh] with cos/sin [..., T, Dh] (already in x's dtype; shared by heads)."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [..., T, 1, Dh]
    pairs = x.unflatten(-1, (-1, 2))  # [..., T, H, Dh/2, 2]
    swapped = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)  # [..., T, H, Dh]
    return x * cos + swapped * sin
