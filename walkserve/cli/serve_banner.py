"""What ``walkserve serve`` prints once it accepts connections: the model, its routes and a curl to try."""

from __future__ import annotations

import json
import shlex

from walkserve.models.processor import ModelCard

# (method, path, capabilities any of which makes the route useful)
ROUTES = (
    ("POST", "/v1/completions", ("completions",)),
    ("POST", "/v1/chat/completions", ("chat",)),
    ("POST", "/v1/audio/speech", ("speech",)),
    ("POST", "/v1/audio/transcriptions", ("audio_in",)),
    ("POST", "/v1/audio/translations", ("audio_in",)),
    ("WS", "/v1/realtime", ("audio_in", "audio_out")),  # the Realtime API's voice sessions (a WebSocket)
    ("POST", "/v1/images/generations", ("images",)),
    ("POST", "/v1/images/edits", ("image_edit",)),
    ("POST", "/v1/generate", ("generate", "completions", "chat", "speech", "images", "encode")),
    ("POST", "/v1/embeddings", ("embeddings",)),
    ("GET", "/", ()),
    ("GET", "/v1/models", ()),
    ("GET", "/health", ()),
    ("GET", "/metrics", ()),
    ("GET", "/docs", ()),
)


def base_url(host: str, port: int) -> str:
    """The URL a local client uses: a wildcard bind is reached through loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def routes_for(card: ModelCard) -> list[str]:
    return [f"{method} {path}" for method, path, caps in ROUTES if not caps or set(caps) & card.capabilities]


def try_command(card: ModelCard, url: str, auth: bool) -> str | None:
    """One curl command line that works against this model (None if no route fits)."""
    caps = card.capabilities
    out = None
    if "speech" in caps:
        body: dict = {"input": "Hello from walkserve.", "response_format": "wav"}
        if card.default_voice:
            body["voice"] = card.default_voice
        path, out = "/v1/audio/speech", "out.wav"
    elif "chat" in caps:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}
    elif "completions" in caps:
        path, body = "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 32}
    elif "images" in caps:
        path, body = "/v1/images/generations", {"prompt": "a red square", "size": "64x64"}
    else:
        return None
    parts = ["curl -s", shlex.quote(url + path), "-H 'Content-Type: application/json'"]
    if auth:
        parts.append('-H "Authorization: Bearer $WALKSERVE_API_KEY"')
    parts += ["-d", shlex.quote(json.dumps(body))]
    if out:
        parts += ["-o", out]
    return " ".join(parts)


def ready_banner(card: ModelCard, url: str, auth: bool, startup_s: float) -> str:
    lines = [f"walkserve: serving {card.id!r} ({card.family}) at {url} (ready in {startup_s:.1f} s)"]
    if card.random_weights:
        lines.append("walkserve: RANDOM WEIGHTS: this checkpoint is untrained; its output is noise")
    lines.append("  routes: " + "  ".join(routes_for(card)))
    command = try_command(card, url, auth)
    if command:
        lines.append(f"  try:    {command}")
    if auth:
        lines.append("          (an API key is required: set WALKSERVE_API_KEY to it in the client's shell)")
    lines.append(f"  browse: {url}/ (the playground)")
    lines.append("  stop:   Ctrl-C or SIGTERM (in-flight requests finish first)")
    return "\n".join(lines)


def say(message: str) -> None:
    """A progress line of ``walkserve serve`` (stdout, flushed, so a pipe sees it at once)."""
    print(f"walkserve: {message}", flush=True)
