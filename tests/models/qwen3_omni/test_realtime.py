"""/v1/realtime on a tiny random Qwen3-Omni, through the openai package's realtime client.

One server per module (the default one-rank placement). With greedy sampling a realtime response is the
chat completion of the conversation so far (session instructions as the system message): its transcript
and its pcm16 audio are equal, byte for byte, to ``POST /v1/chat/completions`` with ``modalities
["text", "audio"]``, for text in, audio in (pcm16 24 kHz appended in chunks, then committed) and a
multi-turn session whose earlier answers the chat request carries as assistant messages. Spoken answers are cut
at ``FRAMES`` codec frames on both sides (the session's ``audio.output.max_frames``, the chat's ``audio.max_frames``):
the random talker would speak for 100 to 300 frames, seconds each, and past the answer's text the frames add nothing
the comparison needs.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time

import numpy as np
import openai
import pytest
import soundfile as sf

from tests.api.real_server import in_thread_server, metric, metrics
from tests.api.realtime_client import answer, append_audio, pcm16, until
from walkserve.core.config import RuntimeConfig
from walkserve.models.qwen3_omni.tiny import write_tiny_qwen3_omni

pytestmark = [pytest.mark.slow]
MAX_TOKENS = 6
INSTRUCTIONS = "Be brief"
VOICE = "Chelsie"
FRAMES = 8  # > MAX_TOKENS: the talker reads every text row of the answer, then its end


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny_qwen3_omni(tmp_path_factory.mktemp("omni_rt") / "tiny-omni", seed=5)
    with in_thread_server("qwen3-omni", path, RuntimeConfig(max_running=8), default_max_tokens=MAX_TOKENS,
                          max_audio_seconds=5.0) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def speech(seconds: float, seed: int) -> bytes:
    """A voiced, pitch-gliding signal at 24 kHz as pcm16."""
    t = np.arange(int(24000 * seconds)) / 24000
    f0 = 120 + 60 * t / seconds
    rng = np.random.default_rng(seed)
    x = sum(np.sin(2 * np.pi * k * np.cumsum(f0) / 24000) / k for k in range(1, 12))
    return pcm16(0.25 * x / np.abs(x).max() + 0.01 * rng.standard_normal(t.shape))


def wav_b64(pcm: bytes) -> str:
    buffer = io.BytesIO()
    sf.write(buffer, np.frombuffer(pcm, "<i2"), 24000, format="WAV", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode()


def chat(client: openai.OpenAI, messages: list[dict], modalities=("text", "audio")) -> tuple[str, bytes]:
    """(transcript, pcm16) of the greedy chat completion."""
    kw = {"modalities": list(modalities), "audio": {"voice": VOICE, "format": "pcm16", "max_frames": FRAMES}} \
        if "audio" in modalities else {}
    reply = client.chat.completions.create(model="tiny-omni", messages=[{"role": "system", "content": INSTRUCTIONS},
                                                                        *messages], temperature=0, **kw)
    message = reply.choices[0].message
    if "audio" not in modalities:
        return message.content, b""
    return message.audio.transcript, base64.b64decode(message.audio.data)


def user_turn(turn) -> dict:
    if isinstance(turn, str):
        return {"role": "user", "content": turn}
    return {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": wav_b64(turn), "format": "wav"}}]}


def thinker_rows(engine) -> tuple[float, float]:
    """(prefilled, reused) prompt rows of the thinker's KV pool, as the workers last reported them."""
    pools = [v for (component, _), v in engine.stats().engine_ranks.items() if component == "thinker"]
    return sum(p.get("prefill_tokens", 0.0) for p in pools), sum(p.get("prefix_hit_tokens", 0.0) for p in pools)


async def settled_rows(engine) -> tuple[float, float]:
    """``thinker_rows`` once nothing runs and the workers have reported them twice alike: a speech prefill or an
    earlier answer still being reported would otherwise land in the next answer's difference."""
    last = None
    while True:
        await asyncio.sleep(0.3)  # more than the status interval
        now = thinker_rows(engine)
        if not engine.stats().running and now == last:
            return now
        last = now


async def session(url: str, turns: list, modalities=("audio",), engine=None, rows: list | None = None) -> list:
    """Each turn (text, or pcm16 audio to append and commit) then a response; the answers in order. With ``engine``,
    each response's (prompt tokens, prefilled rows, reused rows) of the thinker go to ``rows``."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    answers = []
    async with client.realtime.connect(model="tiny-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session={"type": "realtime", "instructions": INSTRUCTIONS, "temperature": 0,
                                           "output_modalities": list(modalities),
                                           "audio": {"input": {"turn_detection": None},
                                                     "output": {"voice": VOICE, "max_frames": FRAMES}}})
        assert (await conn.recv()).type == "session.updated"
        for turn in turns:
            if isinstance(turn, str):
                await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                          "content": [{"type": "input_text", "text": turn}]})
                assert [(await conn.recv()).type for _ in range(2)] == ["conversation.item.added", "conversation.item.done"]
            else:
                await append_audio(conn, turn)
                await conn.input_audio_buffer.commit()
                assert [(await conn.recv()).type for _ in range(3)] == [
                    "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
            before = await settled_rows(engine) if engine is not None else None
            await conn.response.create()
            answers.append(await answer(conn))
            if engine is not None:
                after = await settled_rows(engine)
                rows.append((answers[-1].done.usage.input_tokens, after[0] - before[0], after[1] - before[1]))
    return answers


SPOKEN = ["response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added"]
CLOSING = ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
           "response.output_item.done", "conversation.item.done", "response.done"]


def test_text_and_audio_turns_equal_chat_completions(server, client) -> None:
    turns = ["Hi", speech(0.8, seed=1), "and?"]
    before = metrics(server.url)
    answers = asyncio.run(session(server.url, turns))
    after = metrics(server.url)
    for name in ("walkserve_audio_streams_admitted_total", "walkserve_audio_streams_ended_total"):
        # each spoken answer is a real-time stream: admitted by capacity, played by the session's clock
        assert metric(after, name, route="/v1/realtime") - metric(before, name, route="/v1/realtime") == len(turns)
    assert metric(after, "walkserve_audio_streams_active", route="/v1/realtime") == 0
    history: list[dict] = []
    for turn, got in zip(turns, answers, strict=True):
        history.append(user_turn(turn))
        transcript, audio = chat(client, history)
        assert not got.errors  # cut at max_tokens (the server's default here), as the chat's finish_reason "length"
        assert got.done.status == "incomplete" and got.done.status_details.reason == "max_output_tokens"
        assert got.types[:4] == SPOKEN and got.types[-6:] == CLOSING
        assert got.transcript == transcript and transcript
        assert got.audio == audio and len(audio) > 0
        assert got.done.usage.output_token_details.text_tokens == MAX_TOKENS
        assert 0 < got.done.usage.output_token_details.audio_tokens <= FRAMES
        history.append({"role": "assistant", "content": transcript})
    # the history is a real part of the prompt: the last turn alone gets another answer
    assert chat(client, [user_turn("and?")])[1] != answers[2].audio


def test_a_second_spoken_turn_prefills_only_the_new_turn(server, client) -> None:
    """Two spoken turns: the second's thinker prefill is its new rows (the first answer, the new clip, the
    template) and the rest of the block where they start; the first turn's 3 s clip, whose layer-24 rows the
    talker reads again, is not run again (KV block size 16). The answers equal chat completions."""
    turns, rows = [speech(3.0, seed=7), speech(1.0, seed=8)], []  # a later clip no longer: the first keeps its key
    answers = asyncio.run(session(server.url, turns, engine=server.engine, rows=rows))
    (n1, _, _), (n2, prefilled, reused) = rows
    assert prefilled + reused == n2 - 1  # all but the last prompt row, a one-row firing
    assert reused >= (n1 - 1) // 16 * 16 and prefilled < n2 - n1 + 16
    first = chat(client, [user_turn(turns[0])])
    assert (answers[0].transcript, answers[0].audio) == first
    history = [user_turn(turns[0]), {"role": "assistant", "content": first[0]}, user_turn(turns[1])]
    assert (answers[1].transcript, answers[1].audio) == chat(client, history)


async def transcribed(url: str, pcm: bytes) -> object:
    """A committed turn's input audio transcription (language hint "en"), its completed event."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    async with client.realtime.connect(model="tiny-omni") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "audio": {"input": {
            "turn_detection": None, "transcription": {"model": "whisper-1", "language": "en"}}}})
        await until(conn, "session.updated")
        await append_audio(conn, pcm)
        await conn.input_audio_buffer.commit()
        return await until(conn, "conversation.item.input_audio_transcription.completed")


def test_input_audio_transcription_equals_the_transcription_route(server, client) -> None:
    pcm = speech(1.2, seed=9)
    done = asyncio.run(transcribed(server.url, pcm))
    wav = io.BytesIO(base64.b64decode(wav_b64(pcm)))
    want = client.audio.transcriptions.create(model="tiny-omni", file=("turn.wav", wav), language="en")
    assert done.transcript == want.text and want.text
    assert done.usage.output_tokens == MAX_TOKENS


def test_text_output_equals_a_text_chat(server, client) -> None:
    got = asyncio.run(session(server.url, ["Hi"], modalities=("text",)))[0]
    assert "response.output_text.delta" in got.types and "response.output_audio.delta" not in got.types
    assert got.transcript == chat(client, [user_turn("Hi")], modalities=("text",))[0] and not got.audio


async def cancelled(url: str) -> tuple[object, float]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    async with client.realtime.connect(model="tiny-omni") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 400, "temperature": 0,
                                           "audio": {"input": {"turn_detection": None}}})
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Talk"}]})
        await conn.response.create()
        said = ""
        while (event := await conn.recv()).type != "response.output_audio.delta":
            said += getattr(event, "delta", "") if event.type.endswith("transcript.delta") else ""
        t0 = time.monotonic()
        await conn.response.cancel()
        got = await answer(conn, event)
        got.transcript = said + got.transcript
        return got, time.monotonic() - t0


def test_cancel_ends_the_response_and_its_request(server) -> None:
    got, latency = asyncio.run(cancelled(server.url))
    assert got.done.status == "cancelled" and got.done.status_details.reason == "client_cancelled"
    assert got.done.output[0].status == "incomplete"
    assert got.done.output[0].content[0].transcript == got.transcript  # the item keeps what was sent
    assert latency < 5
    deadline = time.monotonic() + 10
    while server.engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.engine.stats().running == 0


async def barge_in(url: str, engine) -> tuple[object, object, int]:
    """Server VAD ends a spoken turn and answers it; speech during the answer cancels it. Also returns the
    runtime's running requests a moment later, the session still open."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    async with client.realtime.connect(model="tiny-omni") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 400, "temperature": 0,
                                           "audio": {"input": {"turn_detection": {
                                               "type": "server_vad", "silence_duration_ms": 300}}}})
        await append_audio(conn, bytes(2 * 9600) + speech(1.0, seed=3) + bytes(2 * 14400))
        seen: list = []
        stopped = await until(conn, "input_audio_buffer.speech_stopped", seen)
        await until(conn, "response.created", seen)
        first = await until(conn, "response.output_audio.delta", seen)
        await append_audio(conn, speech(0.5, seed=4))
        got = await answer(conn, first)
        deadline = time.monotonic() + 10
        while engine.stats().running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return stopped, got, engine.stats().running


def test_server_vad_answers_and_barge_in_aborts_the_answer(server) -> None:
    stopped, got, running = asyncio.run(barge_in(server.url, server.engine))
    assert 1600 <= stopped.audio_end_ms <= 1800  # 0.4 s silence + 1 s speech + the 300 ms hangover
    assert got.done.status == "cancelled" and got.done.status_details.reason == "turn_detected"
    assert "input_audio_buffer.speech_started" in got.types
    assert running == 0  # the cancelled answer's request was aborted, not left to run


def _thinker_prefilled(url: str) -> float:
    return metric(metrics(url), "walkserve_kv_pool_prefill_tokens_total", component="thinker", rank="0")


async def _settled(url: str, engine) -> float:
    """The thinker's prefilled-rows counter once nothing runs and the workers have reported it twice alike."""
    last = None
    while True:
        await asyncio.sleep(0.3)  # more than the status interval
        now = await asyncio.to_thread(_thinker_prefilled, url)
        if not engine.stats().running and now == last:
            return now
        last = now


async def pieces_session(url: str, engine, pcm: bytes, modalities: tuple[str, ...]) -> tuple[object, float]:
    """``pcm`` appended in 40 ms pieces, the prefill of its whole windows left to finish, then committed and
    answered; returns the answer and the thinker rows the commit's response prefilled."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    async with client.realtime.connect(model="tiny-omni") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "instructions": INSTRUCTIONS, "temperature": 0,
                                           "output_modalities": list(modalities),
                                           "audio": {"input": {"turn_detection": None},
                                                     "output": {"voice": VOICE, "max_frames": FRAMES}}})
        await until(conn, "session.updated")
        await append_audio(conn, pcm, chunk=960)
        before = await _settled(url, engine)
        await conn.input_audio_buffer.commit()
        await until(conn, "conversation.item.done")
        await conn.response.create()
        got = await answer(conn)
        return got, await _settled(url, engine) - before


def test_speech_in_small_pieces_is_prefilled_while_it_arrives(server, client) -> None:
    """4.6 s of speech in 115 appends: the encoder's 2 s windows (26 rows each) are prefilled as they become
    whole, so the committed turn computes only the last 0.6 s and the rows after it, text or spoken (its media
    piece's whole windows' captured rows kept by the capture cache), and the answer (text, and spoken:
    transcript and audio) is the chat completion's."""
    clip = speech(4.6, seed=6)  # 460 mel frames: 60 thinker rows, 52 of them in two whole windows
    got, prefilled = asyncio.run(pieces_session(server.url, server.engine, clip, ("text",)))
    assert not got.errors and got.transcript == chat(client, [user_turn(clip)], modalities=("text",))[0]
    assert 0 < prefilled < 60 - 26  # the tail, the rows after the clip, the block where the cached rows end
    spoken = speech(4.6, seed=7)
    got, prefilled = asyncio.run(pieces_session(server.url, server.engine, spoken, ("audio",)))
    transcript, audio = chat(client, [user_turn(spoken)])
    assert not got.errors and got.transcript == transcript and got.audio == audio and audio
    # spoken too: the clip's captured rows (what the talker reads) come from the capture cache, kept by the spoken
    # prefills (65 rows computed after commit when they were text answers); the engine-level test of a clip
    # extended by windows is tests/engines/kv/test_capture_cache.py
    assert prefilled < 60 - 26


def test_a_response_that_fails_on_an_item_names_the_item(server) -> None:
    """The model refuses a clip shorter than 12.5 ms: the error names the conversation item the client sent (its id,
    param ``item.content[0]``), not the chat message the server built from it."""
    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        async with client.realtime.connect(model="tiny-omni") as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.session.update(session={"type": "realtime", "instructions": INSTRUCTIONS,
                                               "output_modalities": ["text"]})
            assert (await conn.recv()).type == "session.updated"
            clip = base64.b64encode(speech(0.005, seed=1)).decode()  # 120 samples at 24 kHz
            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_audio", "audio": clip}]})
            added = await conn.recv()
            assert added.type == "conversation.item.added"
            assert (await conn.recv()).type == "conversation.item.done"
            await conn.response.create()
            events = []
            while not events or events[-1].type != "response.done":
                events.append(await conn.recv())
            [error] = [e for e in events if e.type == "error"]
            assert error.error.param == "item.content[0]" and added.item.id in error.error.message, error
            assert "too short" in error.error.message and events[-1].response.status == "failed"
    asyncio.run(run())
