"""Which samples a Code2Wav chunk can emit exactly, and which frames they depend on (integer arithmetic, torch-free).

The vocoder is causal except for its decoder's transposed convolutions. Each
(kernel 2s, stride s) trims s samples on both sides, so its output sample m
reads inputs floor(m/s) and floor(m/s) + 1: one step of look-ahead. Decoding
frames [0, b) therefore yields 1920 b - 555 samples (release numbers), all of
them final; the last 555 samples of frame b - 1 need frame b::

    lookahead = sum over decoder blocks k of s_k * prod(s_j, j > k) = 8*60 + 5*12 + 4*3 + 3 = 555

A streamed chunk with new frames [a, b) emits global samples
``[1920 a - 555, 1920 b - 555)`` (from 0 for the first chunk): every sample
once, each equal to the whole decode, and the stream as a whole is delayed
by 555 samples (23 ms) and ends where the whole decode ends (1920 F - 555).

Left receptive field, in frames, of the samples a chunk emits:
  - the convolution stack (upsampling ConvNeXt blocks, decoder convs and
    residual units) reaches ``conv_reach`` frames back (9 for the release);
  - the pre-transformer's sliding-window attention reaches
    ``layers * (window - 1)`` frames further (8 * 71 = 568 for the release).
A chunk is exact when its left context covers both, or starts at frame 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from walkserve.streaming.policy import Span

CONV_KERNEL = 7  # every causal conv of the vocoder (ConvNeXt dwconv, decoder in/out, residual units)
RESIDUAL_DILATIONS = (1, 3, 9)


@dataclass(frozen=True)
class Code2WavGeometry:
    """The time-axis shape of one vocoder: upsampling ratios, decoder rates, attention window and depth."""

    upsampling_ratios: tuple[int, ...]  # ConvNeXt stage strides (kernel = stride: no overlap)
    upsample_rates: tuple[int, ...]  # decoder block strides (kernel = 2 * stride: one step of look-ahead)
    sliding_window: int
    num_layers: int

    @property
    def frame_samples(self) -> int:
        out = 1
        for r in self.upsampling_ratios + self.upsample_rates:
            out *= r
        return out

    @property
    def lookahead_samples(self) -> int:
        """Samples at the end of a decode that need the next frame (555): the sum of each block's trim."""
        total, after = 0, 1
        for s in reversed(self.upsample_rates):
            total += s * after
            after *= s
        return total

    @property
    def attention_reach(self) -> int:
        """Frames back one output frame of the pre-transformer sees: (window - 1) per layer."""
        return self.num_layers * (self.sliding_window - 1)

    def decoded_samples(self, n_frames: int) -> int:
        """Samples of a whole decode of ``n_frames`` frames: 1920 n - 555 (0 for none)."""
        return max(0, self.frame_samples * n_frames - self.lookahead_samples) if n_frames else 0

    def emitted(self, new_start: int, new_end: int) -> tuple[int, int]:
        """Global samples ``[lo, hi)`` a chunk with new frames ``[new_start, new_end)`` emits."""
        lo = self.decoded_samples(new_start)
        return lo, max(lo, self.decoded_samples(new_end))

    def conv_frames(self, lo: int, hi: int) -> tuple[int, int]:
        """Frames ``[f_lo, f_hi]`` (inclusive) the convolution stack reads for samples ``[lo, hi]`` (inclusive).

        Walks the stages backwards; ``f_lo`` is not clamped at 0, so a negative
        value says the samples would read before the stream's start (zero padding).
        """
        reach = CONV_KERNEL - 1
        lo -= reach  # final causal conv
        for s in reversed(self.upsample_rates):
            lo -= reach * sum(RESIDUAL_DILATIONS)  # residual units after the transposed conv
            lo, hi = lo // s, hi // s + 1  # transposed conv, kernel 2s: inputs m//s and m//s + 1
        lo -= reach  # the decoder's input conv
        for r in reversed(self.upsampling_ratios):
            lo -= reach  # ConvNeXt depthwise conv
            lo, hi = lo // r, hi // r  # transposed conv, kernel = stride: input m//r only
        return lo, hi

    def conv_reach(self, new_start: int) -> int:
        """How many frames before ``new_start`` the first sample a chunk emits reads through the convolutions."""
        lo, _ = self.emitted(new_start, new_start + 1)
        return new_start - self.conv_frames(lo, lo)[0]

    def exact_context(self) -> int:
        """The fewest frames of left context with which every chunk equals the whole decode."""
        return self.conv_reach(1 << 20) + self.attention_reach


@dataclass(frozen=True)
class ChunkPlan:
    """One Code2Wav firing: decode the span's frames, keep samples ``[keep_lo, keep_hi)`` of that decode."""

    first_frame: int
    n_frames: int
    keep_lo: int
    keep_hi: int

    @property
    def n_samples(self) -> int:
        return self.keep_hi - self.keep_lo


def plan_chunk(span: Span, geometry: Code2WavGeometry) -> ChunkPlan:
    """The decode and the kept samples for chunk ``span`` of a ``LeftContext`` stream of frames."""
    new_start = span.start + span.n_context
    lo, hi = geometry.emitted(new_start, span.end)
    base = geometry.frame_samples * span.start  # global index of the decode's sample 0
    return ChunkPlan(span.start, span.n_items, lo - base, hi - base)
