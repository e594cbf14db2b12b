"""ServerConfig: every limit and switch of the HTTP server, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

from walkserve.core.errors import ConfigError

MIB = 1024 * 1024
WS_SLACK_BYTES = MIB  # openpi: a message a little over its limit gets an error frame; a far larger one, close 1009


@dataclass(frozen=True)
class ServerConfig:
    """How the HTTP server listens and what it accepts.

    ``api_key`` None disables authentication (the default bind is loopback
    only). ``media_allowlist`` holds URL prefixes (``https://host/path/``)
    the server may fetch media from; empty means data URLs only.
    ``model_aliases`` are extra names accepted in the ``model`` field.
    ``default_max_tokens`` replaces the model card's default ``max_tokens``
    for requests that set none (the only bound a ``/v1/audio/speech``
    request has on its length). ``realtime_*`` bound the ``/v1/realtime``
    sessions: how many at once, how long one lasts, how much input audio one
    buffers before a commit, the largest client event (a larger one is an
    ``error`` event), the largest frame read at all (None: twice the event
    limit; a larger one closes the socket, 1009), and how long a session may
    stay silent (no client event) before it is closed;
    ``realtime_prefill_while_speaking`` prefills the speech window by window
    while it arrives (``api/realtime/speech_prefill.py``).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_body_bytes: int = 32 * MIB
    max_ws_message_bytes: int = 16 * MIB
    max_media_parts: int = 8
    max_image_pixels: int = 4096 * 4096
    max_audio_seconds: float = 300.0
    max_n: int = 8
    media_allowlist: tuple[str, ...] = ()
    media_fetch_timeout_s: float = 10.0
    drain_timeout_s: float = 30.0
    model_aliases: tuple[str, ...] = ()
    max_speech_chars: int = 4096
    max_stop_strings: int = 16
    default_max_tokens: int | None = None
    realtime_max_sessions: int = 32
    realtime_max_session_s: float = 1800.0
    realtime_max_buffer_s: float = 120.0
    realtime_max_event_bytes: int = 15 * MIB
    realtime_max_frame_bytes: int | None = None
    realtime_idle_timeout_s: float = 300.0
    realtime_prefill_while_speaking: bool = True  # prefill each whole audio-encoder window as it is heard
    stream_startup_buffer_s: float = 1.0  # a real-time stream's listener buffers min(TTFA, this) before playing
    log_level: str = "info"

    def __post_init__(self) -> None:
        self._positive("max_body_bytes", "max_media_parts", "max_image_pixels", "max_n", "max_speech_chars",
                       "max_ws_message_bytes")
        self._positive("max_audio_seconds", "media_fetch_timeout_s", "max_stop_strings")
        self._positive("realtime_max_sessions", "realtime_max_session_s", "realtime_max_buffer_s",
                       "realtime_max_event_bytes", "realtime_idle_timeout_s")
        frame = self.realtime_max_frame_bytes
        if frame is not None and (isinstance(frame, bool) or not isinstance(frame, int)
                                  or frame <= self.realtime_max_event_bytes):
            raise ConfigError("ServerConfig.realtime_max_frame_bytes must be an integer above realtime_max_event_bytes "
                              f"({self.realtime_max_event_bytes}) or None, got {frame!r}")
        n = self.default_max_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"ServerConfig.default_max_tokens must be a positive integer or None, got {n!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"ServerConfig.port must be in [0, 65535], got {self.port}")
        if self.stream_startup_buffer_s < 0:
            raise ConfigError(f"ServerConfig.stream_startup_buffer_s must be >= 0, got {self.stream_startup_buffer_s}")
        if self.drain_timeout_s < 0:
            raise ConfigError(f"ServerConfig.drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("ServerConfig.api_key must not be empty (use None to disable authentication)")
        for prefix in self.media_allowlist:
            if not prefix.startswith(("http://", "https://")) or prefix.count("/") < 3:
                raise ConfigError(f"media_allowlist entry {prefix!r} must look like https://host/ (scheme, host, '/')")

    @property
    def realtime_frame_ceiling(self) -> int:
        """The largest /v1/realtime frame read: a larger one closes the socket (1009, message too big)."""
        return self.realtime_max_frame_bytes or 2 * self.realtime_max_event_bytes

    @property
    def openpi_frame_ceiling(self) -> int:
        """The largest /v1/openpi frame read: a larger one closes the socket (1009, message too big)."""
        return self.max_ws_message_bytes + WS_SLACK_BYTES

    @property
    def ws_max_size(self) -> int:
        """uvicorn's frame cap: the larger route ceiling (each route closes frames over its own)."""
        return max(self.openpi_frame_ceiling, self.realtime_frame_ceiling)

    def _positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"ServerConfig.{name} must be a positive number, got {value!r}")
