"""Our talker + code predictor + Code2Wav loop against transformers' generate(return_audio=True), greedy.

Both sides read the reference thinker's outputs (its tokens, input embeddings
and the input of layer accept_hidden_layer); transformers runs greedy with
``talker_do_sample=False, talker_repetition_penalty=1.0``. Every code of every
frame must be identical, and our streamed waveform equal to its decode.
"""

from __future__ import annotations

import pytest
import torch

from tests.models.qwen3_omni.speech_oracle import (
    IM_END,
    ThinkerRun,
    generate_codes,
    mm_inputs,
    reference,
    run_thinker,
    talker_positions,
    text_prompt,
)
from walkserve.core.sampling import SamplingParams
from walkserve.models.qwen3_omni.speech.loop import SpeechLoop, ThinkerOutput
from walkserve.models.qwen3_omni.speech.rules import spoken_tokens
from walkserve.models.qwen3_omni.speech.weights import load_speech

pytestmark = pytest.mark.parity
torch.set_num_threads(1)
THINKER_TOKENS, FRAMES = 8, 10  # the reference stops the talker after FRAMES + 1 code-0 tokens: FRAMES frames


@pytest.fixture(scope="module")
def loop() -> SpeechLoop:
    return SpeechLoop(load_speech(reference().path, progress=False))


def thinker_output(run: ThinkerRun, spoken: list[int], accept: torch.Tensor, positions=None) -> ThinkerOutput:
    """Our loop's input from the reference thinker's run; the spoken tokens' rows of its embedding table."""
    length = run.prompt.shape[0]
    with torch.no_grad():
        text = reference().model.thinker.get_input_embeddings()(torch.tensor(spoken, dtype=torch.long))
    return ThinkerOutput(run.prompt, run.embeds[:length], accept, text, positions)


def test_generated_tokens_enter_the_thinker_as_their_table_rows(text_case):
    _, run, _ = text_case
    length = run.prompt.shape[0]
    got = thinker_output(run, run.generated[:-1], run.accept_input).text_embeds
    torch.testing.assert_close(got, run.embeds[length:], rtol=0, atol=0)


def assert_audio_matches(ours: torch.Tensor, want: torch.Tensor):
    assert ours.shape == want.shape  # 1920 F - 555: transformers decodes <= 300 frames in one piece
    assert float((ours - want).abs().max()) <= 2e-3 * float(want.abs().max())


@pytest.fixture(scope="module")
def text_case():
    """Text only, the thinker stopped by EOS: the reference's 4th greedy token is declared the EOS id here."""
    ids = text_prompt()
    run = run_thinker(ids, {}, THINKER_TOKENS)
    eos = run.generated[3]
    return ids, run, eos


def test_text_codes_and_audio_equal_generate(loop, text_case):
    ids, run, eos = text_case
    generated, want, wav = generate_codes(ids, {}, THINKER_TOKENS, FRAMES + 1, eos=eos)
    assert generated == run.generated[:4]
    spoken = spoken_tokens(generated, (eos,))
    assert spoken == generated[:3]  # trailing text: 2 tokens, tts_eos at step 2, tts_pad from step 3
    codes = loop.codes(thinker_output(run, spoken, run.accept_input), speaker="Ethan", max_frames=FRAMES)
    assert codes.shape == want.shape == (FRAMES, 16)
    assert torch.equal(codes, want)
    assert_audio_matches(loop.waveform(codes), wav)
    swapped = thinker_output(run, spoken[:1] + spoken[1:][::-1], run.accept_input)  # the talker hears its text
    assert not torch.equal(loop.codes(swapped, max_frames=FRAMES), want)


@pytest.fixture(scope="module")
def mm_case():
    ids, extra = mm_inputs()
    run = run_thinker(ids, extra, THINKER_TOKENS)
    generated, codes, wav = generate_codes(ids, extra, THINKER_TOKENS, FRAMES + 1)
    assert generated == run.generated and IM_END not in generated  # stopped by max_tokens
    return ids, extra, run, codes, wav


def test_audio_and_image_codes_equal_generate(loop, mm_case):
    """The user turn's audio and image positions take hidden_projection of the INPUT of layer accept_hidden_layer."""
    ids, extra, run, want, wav = mm_case
    spoken = spoken_tokens(run.generated, (IM_END,), drop_unfinished_last=True)  # as transformers does
    out = thinker_output(run, spoken, run.accept_input, talker_positions(ids, extra))
    codes = loop.codes(out, speaker="Ethan", max_frames=FRAMES)
    assert torch.equal(codes, want)
    assert_audio_matches(loop.waveform(codes), wav)


def test_the_accept_layer_is_the_input_of_layer_k(loop, mm_case):
    """transformers' hidden_states[k] is the input of decoder layer k; the output (M*'s choice) differs."""
    ids, extra, run, _, _ = mm_case
    torch.testing.assert_close(run.hidden_states_accept, run.accept_input, rtol=0, atol=0)
    media = (run.prompt[:, None] == torch.tensor(loop.m.config.tokens.media_pads)).any(-1)
    assert float((run.accept_output - run.accept_input)[media].abs().max()) > 0.5
    spoken = spoken_tokens(run.generated, (IM_END,), drop_unfinished_last=True)
    positions = talker_positions(ids, extra)
    wrong = loop.codes(thinker_output(run, spoken, run.accept_output, positions), max_frames=FRAMES)
    assert not torch.equal(wrong, mm_case[3])  # with the output of layer k the codes leave generate's


def test_a_thinker_stopped_by_max_tokens_hands_its_last_token_to_the_talker(loop, mm_case):
    """transformers drops the last token of an unfinished answer; we speak it: the same frames until it matters."""
    ids, extra, run, want, _ = mm_case
    ours = spoken_tokens(run.generated, (IM_END,))
    assert ours == run.generated and len(ours) == THINKER_TOKENS
    codes = loop.codes(thinker_output(run, ours, run.accept_input, talker_positions(ids, extra)),
                       max_frames=THINKER_TOKENS)
    # decode step i reads token i + 1: the sides agree through step n - 3 (frames 0..n-2); at step n - 2
    # transformers reads tts_eos where we read the last token, and frame n - 1 differs
    n = THINKER_TOKENS
    assert torch.equal(codes[: n - 1], want[: n - 1])
    assert not torch.equal(codes[n - 1], want[n - 1])


def test_a_seeded_sampled_run_is_reproducible(loop, text_case):
    _, run, eos = text_case
    out = thinker_output(run, spoken_tokens(run.generated[:4], (eos,)), run.accept_input)
    talker = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=7)
    predictor = SamplingParams(temperature=1.0, top_k=50, top_p=0.8, seed=7)
    a = loop.codes(out, "Chelsie", max_frames=3, talker_sampling=talker, predictor_sampling=predictor)
    b = loop.codes(out, "chelsie", max_frames=3, talker_sampling=talker, predictor_sampling=predictor)
    assert torch.equal(a, b)
    other = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=8)
    c = loop.codes(out, "Chelsie", max_frames=3, talker_sampling=other, predictor_sampling=predictor)
    assert not torch.equal(a, c)
    assert ((a[:, 0] < 128) & (a[:, 1:] < 128).all(-1)).all()  # code 0 never a control id; residuals in range
