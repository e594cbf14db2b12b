"""Which time steps each upsampling block must compute so the decoder's output covers ``[lo, hi)``.

A streaming client keeps one or two frames of each decoded 4-frame window, so
most of the high-resolution work is thrown away. Every decoder layer is local
in time, so the kept samples depend only on a known neighbourhood; walking the
layers backwards gives, per block, the input steps to read, the upsampler
outputs to compute and the block outputs to keep. Computing a layer on a slice
as if it were the whole sequence is exact wherever its receptive field stays
inside the slice or meets a true edge of the sequence (both zero-padded), and
the planned slices are wide enough for every step that is kept::

    out conv (k7):              needs block outputs    [lo - 3, hi + 3)
    block: residual k7 x (1, 3, 9 dilation):  upsampler outputs  [a - 39, b + 39)
           upsampler (kernel 2s, stride s, padding p): output m reads inputs
           floor((m + p) / s) - 1 and floor((m + p) / s)

(everything clipped to the sequence). Same bits as decoding the whole window
and slicing: the kernels compute each kept step with the same operations in
the same order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RESIDUAL_DILATIONS = (1, 3, 9)  # an upsampling block's three kernel-7 residual units
OUT_HALF_KERNEL = 3  # the output convolution's kernel 7
RESIDUAL_REACH = 3 * sum(RESIDUAL_DILATIONS)  # three kernel-7 units: 3 * (1 + 3 + 9) = 39 steps each side


@dataclass(frozen=True)
class BlockSpan:
    """One upsampling block's work, in absolute steps of its own sequences (half-open ranges)."""

    inputs: tuple[int, int]  # block input steps read (the previous block's kept outputs)
    upsampled: tuple[int, int]  # upsampler outputs computed (residual units run on these)
    kept: tuple[int, int]  # block outputs passed on
    length: int  # the block's full output length (noise is drawn for all of it)


def _widen(span: tuple[int, int], by: int, length: int) -> tuple[int, int]:
    return max(0, span[0] - by), min(length, span[1] + by)


def upsampler_inputs(out: tuple[int, int], stride: int, length_in: int) -> tuple[int, int]:
    """Input steps a kernel-``2 stride`` transposed convolution reads for outputs ``out``."""
    pad = math.ceil(stride / 2)
    lo = (out[0] + pad) // stride - 1
    hi = (out[1] - 1 + pad) // stride + 1
    return max(0, lo), min(length_in, hi)


def plan_spans(rates: tuple[int, ...], steps: int, keep: tuple[int, int]) -> list[BlockSpan]:
    """Per block, what to compute so the output keeps samples ``keep`` of ``steps * prod(rates)``."""
    lengths = [steps]
    for rate in rates:
        lengths.append(lengths[-1] * rate)  # lengths[k]: block k's input length; lengths[-1]: output
    need = _widen(keep, OUT_HALF_KERNEL, lengths[-1])
    spans: list[BlockSpan] = []
    for k in reversed(range(len(rates))):
        upsampled = _widen(need, RESIDUAL_REACH, lengths[k + 1])
        inputs = upsampler_inputs(upsampled, rates[k], lengths[k])
        spans.append(BlockSpan(inputs, upsampled, need, lengths[k + 1]))
        need = inputs
    return spans[::-1]
