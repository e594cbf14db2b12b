"""The speech path as one offline loop over DenseAttention: thinker outputs -> codec frames -> waveform.

The oracle the served graph (talker_prefill, talker_last_prefill, the
talker_decode loop with its nested 15-step code-predictor loop, the streamed
Code2Wav) is tested against. Given one request's thinker outputs::

    prefix = user turn(s) + 9 assistant positions           (talker_inputs)
    h = talker(prefix); code0 = sample(head(h[-1]), code0_ranges)
    until code0 is codec EOS or max_frames:
        codes 1..15 = code predictor on [h[-1], embed(code0)], 15 steps, fresh context
        frame = [code0, codes 1..15]
        h = talker(sum of the frame's 16 embeddings + trailing text i), one position
        code0 = sample(head(h), code0_ranges)
    waveform = Code2WavStream over LeftContext(25, 25) chunks of the frames

Sampling goes through walkserve's Sampler with the speech_rules ranges, so
``temperature 0`` is greedy and a seeded run is reproducible.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from walkserve.core.sampling import SamplingParams
from walkserve.layers.attention import DenseAttention
from walkserve.layers.sampling import Sampler, SampleRow, step_seed
from walkserve.models.qwen3_omni.speech.code2wav_stream import POLICY, Code2WavStream
from walkserve.models.qwen3_omni.speech.rules import (
    GREEDY,
    assistant_start,
    code0_ranges,
    predictor_ranges,
    speaker_id,
    trailing_text,
)
from walkserve.models.qwen3_omni.speech.talker_inputs import (
    assistant_head,
    assistant_tail,
    decode_input,
    frame_embedding,
    text_positions,
    user_inputs,
)
from walkserve.models.qwen3_omni.speech.weights import SpeechModules
from walkserve.streaming.policy import ChunkPolicy


@dataclass
class ThinkerOutput:
    """One request's thinker results, as the talker consumes them.

    prompt_ids [L], prompt_embeds [L, Dt]: the prompt and the thinker's input embeddings (media features in place);
    accept_states [L, Dt]: the thinker's state entering layer ``accept_hidden_layer`` (media rows are read);
    text_embeds [n, Dt]: thinker input embeddings of the n tokens to speak (``speech_rules.spoken_tokens``);
    prefill_positions [3, U + 9]: the talker's prefill rope positions (``get_rope_index`` over
    ``talker_prompt_ids``); None for text-like positions 0, 1, 2, ...
    """

    prompt_ids: torch.Tensor
    prompt_embeds: torch.Tensor
    accept_states: torch.Tensor
    text_embeds: torch.Tensor
    prefill_positions: torch.Tensor | None = None


@dataclass
class _Talk:
    """The talker's running state for one request."""

    kv: dict
    hidden: torch.Tensor  # [D] final-norm hidden state of the last position
    position: int  # rope position of the next decode step
    trailing: torch.Tensor  # [n_after - 1, D] projected assistant text after token 0
    code0: list[int]  # code-0 ids drawn so far (the repetition penalty's history)


class SpeechLoop:
    """Talker + code predictor + Code2Wav of one checkpoint, run one request at a time."""

    def __init__(self, modules: SpeechModules, sampler: Sampler | None = None):
        self.m = modules
        self.sampler = sampler or Sampler(seed=0)
        self.stream = Code2WavStream(modules.code2wav)

    @torch.no_grad()
    def codes(self, thinker: ThinkerOutput, speaker: str | None = None, max_frames: int = 4096,
              talker_sampling: SamplingParams = GREEDY, predictor_sampling: SamplingParams = GREEDY) -> torch.Tensor:
        """The frames int64 [F, 16] until codec EOS (not included) or ``max_frames``."""
        cfg = self.m.config
        talk = self._prefill(thinker, speaker_id(cfg.speakers, speaker))
        ranges = code0_ranges(cfg.talker.vocab_size, cfg.tokens.codec_eos)
        frames: list[torch.Tensor] = []
        while len(frames) < max_frames:
            code0 = self._draw(self.m.talker.compute_logits(talk.hidden[None]), talker_sampling, talk.code0, ranges)
            if code0 == cfg.tokens.codec_eos:
                break
            talk.code0.append(code0)
            frame = self._residuals(talk.hidden, code0, self._frame_sampling(predictor_sampling, len(frames)))
            frames.append(frame)
            self._step(talk, frame, len(frames) - 1)
        return torch.stack(frames) if frames else torch.zeros(0, cfg.num_code_groups, dtype=torch.long)

    @torch.no_grad()
    def waveform(self, frames: torch.Tensor, policy: ChunkPolicy = POLICY) -> torch.Tensor:
        """float32 [1920 F - 555]: the frames through Code2WavStream chunk by chunk, as the stream delivers them."""
        from walkserve.engines.spec import Batch, Item

        out, i = [], 0
        while (span := policy.span(i, frames.shape[0], ended=True)) is not None:
            item = Item({"codes": frames[span.start : span.end]}, "offline", "speech", (i,), ("audio",),
                        spans={"codes": span})
            out.append(self.stream.forward_batch(Batch("code2wav", "forward", (item,)))[0]["audio"])
            i += 1
        return torch.cat(out) if out else torch.zeros(0)

    def _prefill(self, thinker: ThinkerOutput, speaker: int) -> _Talk:
        m, tokens = self.m, self.m.config.tokens
        ids, embeds = thinker.prompt_ids, thinker.prompt_embeds
        a0 = assistant_start(ids.tolist(), tokens.im_start, tokens.assistant)
        after = torch.cat([embeds[a0 + 3 :], thinker.text_embeds])  # [n_after, Dt]: the assistant text to speak
        if not after.shape[0]:
            raise ValueError("nothing to speak: the thinker produced no text token")
        prefix = torch.cat([
            user_inputs(m.talker, ids, embeds, thinker.accept_states, tokens),
            assistant_head(m.talker, embeds[a0 : a0 + 3]),
            assistant_tail(m.talker, after[0], speaker, m.specials, tokens),
        ])  # [U + 9, D]
        positions = thinker.prefill_positions
        if positions is None:
            positions = text_positions(prefix.shape[0], device=prefix.device)
        attn = DenseAttention("causal", keep=True)
        hidden = m.talker(None, positions, attn, inputs_embeds=prefix)  # [U + 9, D]
        trailing = m.talker.project_text(after[1:])  # [n_after - 1, D]
        return _Talk(attn.kv, hidden[-1], int(positions.max()) + 1, trailing, [])

    def _residuals(self, hidden: torch.Tensor, code0: int, params: SamplingParams) -> torch.Tensor:
        """Codes 1..15 from a fresh code-predictor context seeded with [hidden, embed(code0)]: the frame [16]."""
        m = self.m
        book = m.config.code_predictor.codebook_size
        x = torch.stack([hidden, m.talker.embed(torch.tensor([code0], device=hidden.device))[0]])  # [2, D]
        attn, drawn = DenseAttention("causal", keep=True), []
        h = m.predictor(None, torch.arange(2, device=x.device), attn, inputs_embeds=x)[-1:]  # [1, D]
        for step in range(m.config.code_predictor.num_residual_groups):
            token = self._draw(m.predictor.compute_logits(h), params, drawn, predictor_ranges(step, book))
            drawn.append(token)
            if step + 1 < m.config.code_predictor.num_residual_groups:
                attn = DenseAttention("causal", past=attn.kv, keep=True)
                ids = torch.tensor([token], device=x.device)
                h = m.predictor(ids, torch.tensor([step + 2], device=x.device), attn)  # [1, D]
        codes = [code0] + [t % book for t in drawn]
        return torch.tensor(codes, dtype=torch.long, device=hidden.device)  # [16]

    def _step(self, talk: _Talk, frame: torch.Tensor, step: int) -> None:
        """One talker decode position: the frame's embedding sum plus the trailing text of ``step``."""
        m = self.m
        rule = trailing_text(step, talk.trailing.shape[0] + 1, thinker_ended=True)
        if rule.kind == "token":
            text = talk.trailing[rule.token - 1]  # trailing row k - 1 holds assistant text token k
        else:
            text = m.specials.eos if rule.kind == "eos" else m.specials.pad
        x = decode_input(frame_embedding(m.talker, m.predictor, frame[None]), text[None])  # [1, D]
        attn = DenseAttention("causal", past=talk.kv, keep=True)
        talk.hidden = m.talker(None, text_positions(1, talk.position, x.device), attn, inputs_embeds=x)[0]
        talk.kv, talk.position = attn.kv, talk.position + 1

    def _draw(self, logits: torch.Tensor, params: SamplingParams, history: list[int],
              ranges: list[tuple[int, int]]) -> int:
        row = SampleRow(params, prompt_and_output=list(history), output=list(history), allowed=ranges)
        return int(self.sampler(logits, [row]).token_ids[0])

    @staticmethod
    def _frame_sampling(params: SamplingParams, frame: int) -> SamplingParams:
        """A seeded predictor draws from (seed, frame) so its 15 steps differ from frame to frame."""
        return params if params.seed is None else dataclasses.replace(params, seed=step_seed(params.seed, frame))
