"""The OpenAI Realtime API (GA events) on ``GET /v1/realtime``: live voice sessions over one WebSocket.

    events.py        server event shapes (dicts, as the ``openai`` package parses them)
    session_config.py  what ``session.update`` sets, validated; the ``session`` object sent back
    conversation.py  the session's items and their conversion to chat messages
    audio_buffer.py  the input audio buffer (pcm16 24 kHz) and its limit
    vad.py           server VAD: webrtcvad frames, a start rule and a silence hangover
    speech_prefill.py  the speech heard so far prefilled window by window while it arrives
    response.py      one response: the chat-completions walks for the conversation, streamed as events
    input_transcription.py  a committed turn transcribed by the served model (the transcription route's prompt)
    session.py       one session: client event -> state change -> server events
    socket.py        the WebSocket: handshake, limits, idle timeout, teardown
"""
