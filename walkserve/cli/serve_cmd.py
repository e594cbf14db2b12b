"""``walkserve serve [MODEL]``: start a model on its placement, then serve it over HTTP.

Order of work: resolve the model (writing the embedded demo checkpoint on
first use), bind the port (a busy port fails before anything slow), load
the model's description, start the runtime (conductor + workers; the workers
load the weights), then run the HTTP server until SIGTERM/SIGINT, which
drains in-flight requests and shuts the runtime down. Every failure is one
line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import sys
import time
from pathlib import Path

from walkserve.api.config import ServerConfig
from walkserve.cli.serve_banner import say
from walkserve.cli.serve_target import SERVED_FAMILIES, resolve_target
from walkserve.core import env
from walkserve.core.config import RuntimeConfig
from walkserve.core.errors import ConfigError, WalkserveError
from walkserve.core.scheduling import DEADLINE, FIFO, StreamScheduling
from walkserve.core.trace import install_log_context

log = logging.getLogger("walkserve.serve")
# (flag, ServerConfig field, type, help) for the server's limits; defaults come from ServerConfig
TIMELINES = 100  # recent requests whose timeline `walkserve serve` keeps by default
LIMIT_FLAGS = (
    ("--max-body-bytes", "max_body_bytes", int, "request body cap in bytes"),
    ("--max-ws-message-bytes", "max_ws_message_bytes", int, "websocket message cap in bytes (openpi's route)"),
    ("--max-media-parts", "max_media_parts", int, "images + audio clips per request"),
    ("--max-image-pixels", "max_image_pixels", int, "pixels per input image and per requested image size"),
    ("--max-audio-seconds", "max_audio_seconds", float, "length of one input audio clip"),
    ("--max-n", "max_n", int, "choices (n) per request"),
    ("--max-speech-chars", "max_speech_chars", int, "input characters of /v1/audio/speech"),
    ("--max-stop-strings", "max_stop_strings", int, "entries of stop"),
    ("--media-fetch-timeout", "media_fetch_timeout_s", float, "seconds to fetch one allowlisted media URL"),
    ("--drain-timeout", "drain_timeout_s", float, "seconds SIGTERM waits for in-flight requests"),
    ("--realtime-max-sessions", "realtime_max_sessions", int, "/v1/realtime sessions at once"),
    ("--realtime-max-session-seconds", "realtime_max_session_s", float, "length of one /v1/realtime session"),
    ("--realtime-max-buffer-seconds", "realtime_max_buffer_s", float,
     "input audio a /v1/realtime session buffers before a commit"),
    ("--realtime-max-event-bytes", "realtime_max_event_bytes", int, "one /v1/realtime client event in bytes"),
    ("--realtime-max-frame-bytes", "realtime_max_frame_bytes", int,
     "the largest /v1/realtime frame read at all (larger: close 1009; default: twice the event limit)"),
    ("--realtime-idle-timeout", "realtime_idle_timeout_s", float,
     "seconds a /v1/realtime session may send nothing before it is closed"),
    ("--default-max-tokens", "default_max_tokens", int,
     "max_tokens of requests that set none (speech: bounds the audio; Orpheus makes 7 tokens per 85 ms)"),
    ("--stream-startup-buffer", "stream_startup_buffer_s", float,
     "seconds a real-time stream's listener buffers at most before playing: a chunk later than that is a gap"),
)

FLAG_OF_FIELD = {flag: name for flag, name, _, _ in LIMIT_FLAGS} | {"--port": "port", "--api-key": "api_key"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over HTTP (OpenAI-compatible routes)",
        description="Start a model and serve it over HTTP. With no MODEL and no --model-path, serves the "
        "embedded demo: a tiny Orpheus with RANDOM weights (its speech is noise), written once into "
        "$WALKSERVE_CACHE_DIR.",
    )
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help=f"model family: {', '.join(SERVED_FAMILIES)} or auto (read it from --model-path; "
                   "the default when a path is given)")
    _model_args(p.add_argument_group("model"))
    _server_args(p.add_argument_group("server"))
    _runtime_args(p.add_argument_group("runtime"))
    p.set_defaults(func=run)


def _model_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--model-path", metavar="DIR", help="checkpoint directory (Orpheus: the LM, or a directory "
                   "holding lm/ and snac/)")
    g.add_argument("--snac-path", metavar="DIR", help="orpheus: the SNAC 24 kHz codec directory "
                   "(after walkserve convert snac)")
    g.add_argument("--tokenizer-path", metavar="FILE", help="pi0 / pi05: PaliGemma's SentencePiece model "
                   "(paligemma_tokenizer.model; lerobot's checkpoints ship none)")
    g.add_argument("--model-id", metavar="NAME", help="the model's name in the API (default: the directory name)")
    g.add_argument("--config", "--placement", dest="config", metavar="PLACEMENT", help="placement YAML (which nodes "
                   "run on which ranks and devices), the name of a shipped one, or auto (walkserve plan chooses one at "
                   "start-up from the profile cache, profiling first if needed); default: every node on one rank, "
                   "cuda:0 if present")
    g.add_argument("--devices", metavar="SPEC", help="with --placement auto: the devices to plan for (cpu:0,cpu:1, "
                   "cuda:0-7, or a file; default: every GPU, else two CPU ranks)")


def _server_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--host", default=ServerConfig.host, help="bind address (default: loopback only)")
    g.add_argument("--port", type=int, default=ServerConfig.port, metavar="N", help="TCP port (default: %(default)s)")
    g.add_argument("--api-key", default=None, metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1/* "
                   "(default: $WALKSERVE_API_KEY; none when unset)")
    for flag, name, kind, text in LIMIT_FLAGS:
        g.add_argument(flag, dest=name, type=kind, default=getattr(ServerConfig, name), metavar="N" if kind is int else "X",
                       help=f"{text} (default: %(default)s)")
    g.add_argument("--media-allowlist", action="append", default=[], metavar="URL_PREFIX",
                   help="http(s) URL prefix media may be fetched from (repeatable; default: data URLs only)")
    g.add_argument("--model-alias", action="append", default=[], metavar="NAME",
                   help="another name accepted in the model field (repeatable)")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _runtime_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--max-running", type=int, default=RuntimeConfig.max_running, metavar="N",
                   help="requests running at once (default: %(default)s)")
    g.add_argument("--max-waiting", type=int, default=RuntimeConfig.max_waiting, metavar="N",
                   help="requests queued beyond those; more are answered 429 (default: %(default)s)")
    g.add_argument("--admission", choices=["capacity", "count"], default=RuntimeConfig.admission,
                   help="real-time audio streams (streamed speech, streamed chat audio): admitted while the measured "
                   "step costs keep every stream ahead of playback (capacity), or by --max-running like any "
                   "request (count) (default: %(default)s; docs/streaming-capacity.md)")
    g.add_argument("--stream-headroom", type=float, default=RuntimeConfig.stream_headroom, metavar="X",
                   help="share of the busiest rank's time real-time streams may take, 0..1 (default: %(default)s)")
    g.add_argument("--stream-ttfa-budget", type=float, default=RuntimeConfig.stream_ttfa_budget_s, metavar="SECONDS",
                   help="a stream over capacity waits only if it can start within this; else 429 at once "
                   "(default: %(default)s)")
    g.add_argument("--max-streams", type=int, default=RuntimeConfig.max_streams, metavar="N",
                   help="at most this many real-time streams at once, whatever the estimate (default: 0 = no bound)")
    g.add_argument("--stream-warmup", type=int, default=RuntimeConfig.stream_warmup, metavar="N",
                   help="real-time streams admitted at once before any step cost is measured (default: %(default)s)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="weights dtype on every rank "
                   "(default: the checkpoint's)")
    g.add_argument("--kv-blocks", type=int, metavar="N",
                   help="KV-cache blocks per LM (default: half the free GPU memory, or a fixed CPU budget)")
    g.add_argument("--no-cohorts", action="store_true", help="step each request's loops on their own, not "
                   "batched with other requests' (see docs/runtime.md)")
    g.add_argument("--stream-scheduling", choices=[DEADLINE, FIFO], default=DEADLINE,
                   help="how each rank orders ready work: by streams' playback deadlines, pacing streams far ahead "
                   "(deadline), or every ready member as it came (fifo, the baseline) (default: %(default)s; "
                   "see docs/runtime.md)")
    g.add_argument("--start-timeout", type=float, default=None, metavar="SECONDS", help="seconds the workers may take to load "
                   "(default: $WALKSERVE_START_TIMEOUT_S)")
    g.add_argument("--ray-address", default=None, metavar="ADDRESS", help="the running Ray cluster a placement with ranks on "
                   "other hosts (or launcher: ray) joins: auto (the one this machine is a node of) or HOST:PORT of its head; "
                   "default: $RAY_ADDRESS, else auto. See docs/multi-host.md")
    g.add_argument("--timelines", type=int, default=TIMELINES, metavar="N", help="recent requests whose timeline "
                   "GET /v1/requests/{id}/timeline serves (0: none; default: %(default)s)")
    g.add_argument("--trace-dir", default=None, metavar="DIR", help="write each request's timeline to DIR/<request id>.json "
                   "(Chrome/Perfetto trace JSON). OpenTelemetry export: the OTEL_* variables, see docs/operability.md")


def server_config(args: argparse.Namespace) -> ServerConfig:
    api_key = args.api_key if args.api_key is not None else env.WALKSERVE_API_KEY.get()
    limits = {name: getattr(args, name) for _, name, _, _ in LIMIT_FLAGS}
    return ServerConfig(host=args.host, port=args.port, api_key=api_key or None,
                        media_allowlist=tuple(args.media_allowlist), model_aliases=tuple(args.model_alias),
                        log_level=args.log_level, **limits)


def runtime_config(args: argparse.Namespace) -> RuntimeConfig:
    if args.kv_blocks is not None and args.kv_blocks < 1:
        raise ConfigError(f"--kv-blocks must be >= 1, got {args.kv_blocks}")
    options = {"engine_options": {"kv": {"num_blocks": args.kv_blocks}}} if args.kv_blocks is not None else {}
    if args.start_timeout is not None:  # else RuntimeConfig reads $WALKSERVE_START_TIMEOUT_S
        options["start_timeout_s"] = args.start_timeout
    if args.ray_address:
        options["ray_address"] = args.ray_address
    streams = {"admission": args.admission, "stream_headroom": args.stream_headroom, "max_streams": args.max_streams,
               "stream_ttfa_budget_s": args.stream_ttfa_budget, "stream_warmup": args.stream_warmup}
    return RuntimeConfig(max_running=args.max_running, max_waiting=args.max_waiting, dtype=args.dtype,
                         cohorts=not args.no_cohorts, stream_scheduling=StreamScheduling(args.stream_scheduling),
                         timelines=args.timelines, trace_dir=args.trace_dir, **options, **streams)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except WalkserveError as e:
        print(f"walkserve: error: {one_line(str(e))}", file=sys.stderr, flush=True)
        return 1


def one_line(message: str) -> str:
    """An error as one line, naming the command-line flag rather than the config field."""
    message = " ".join(message.split())
    for flag, name in FLAG_OF_FIELD.items():
        message = message.replace(f"ServerConfig.{name}", flag)
    for name in ("max_running", "max_waiting"):
        if message.startswith(f"{name} "):
            message = "--" + name.replace("_", "-") + message[len(name):]
    return message


def _run(args: argparse.Namespace) -> int:
    install_log_context()
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s frontend %(levelname)s %(name)s: %(message)s%(trace)s")
    os.environ.setdefault("WALKSERVE_LOG_LEVEL", args.log_level.upper())  # the runtime's processes
    try:
        config, runtime = server_config(args), runtime_config(args)
        target = resolve_target(args.model, args.model_path, args.snac_path, args.model_id,
                                tokenizer_path=args.tokenizer_path)
        if args.devices and args.config != "auto":
            raise ConfigError("--devices says what --placement auto plans for; a placement file names its own devices")
        placement = _auto_placement(target, args) if args.config == "auto" else _placement(args.config)
        if target.embedded:
            config = _prepare_embedded(config)
        sock = bind(config.host, config.port)
    except ValueError as e:  # an environment knob that does not parse
        raise ConfigError(str(e)) from None
    _warn_open_bind(config)
    from walkserve.cli.serve_run import ServeRun

    try:
        with contextlib.closing(sock):
            return asyncio.run(ServeRun(target, placement, runtime, config, sock).main())
    except KeyboardInterrupt:
        say("interrupted; stopped")
        return 130


def _placement(value: str | None) -> Path | None:
    """The placement file, parsed once here so a broken one fails before anything starts."""
    if value is None:
        return None
    from walkserve.cli.placement_arg import placement_path
    from walkserve.placement.plan import load_placement

    path = placement_path(value)
    load_placement(path)
    return path


def _auto_placement(target, args: argparse.Namespace) -> Path:
    """``--placement auto``: plan now (the embedded model's checkpoint is written first, so it can be profiled)."""
    from walkserve.core import env
    from walkserve.models.registry import load_model
    from walkserve.planner.planning import auto_placement

    if target.embedded:
        from walkserve.cli.embedded import ensure_embedded

        ensure_embedded()
    model = load_model(target.ref())
    return auto_placement(model, args.devices, args.dtype, env.WALKSERVE_CACHE_DIR.get() / "plans", say)


def _prepare_embedded(config: ServerConfig) -> ServerConfig:
    """Write (or reuse) the embedded checkpoint; its speech is capped short unless --default-max-tokens says otherwise."""
    from walkserve.cli.embedded import EMBEDDED_MAX_TOKENS, ensure_embedded

    t0 = time.monotonic()
    say("no model given: serving the embedded demo, a tiny Orpheus TTS with RANDOM weights (its speech is noise)")
    path, written = ensure_embedded()
    if written:
        say(f"wrote the embedded checkpoint to {path} ({time.monotonic() - t0:.1f} s; reused next time)")
    else:
        say(f"using the embedded checkpoint in {path}")
    if config.default_max_tokens is not None:
        return config
    say(f"speech is capped at {EMBEDDED_MAX_TOKENS} audio tokens (about 2 s) by default; --default-max-tokens changes it")
    return dataclasses.replace(config, default_max_tokens=EMBEDDED_MAX_TOKENS)


def bind(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket; a busy port is a one-line ConfigError.

    Made with its protocol named (IPPROTO_TCP, as getaddrinfo gives it): asyncio turns Nagle's algorithm
    off (TCP_NODELAY) only on connections whose socket says TCP. Without it a response written in two
    parts (uvicorn writes the head, then the body) waits for the client's delayed ACK: 40 ms on Linux
    added to every answer, a 429 or /health included."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: cannot resolve ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror} (is another server running? choose --port)") from None
    sock.set_inheritable(False)
    return sock


def _warn_open_bind(config: ServerConfig) -> None:
    if config.host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        say(f"warning: listening on {config.host} without --api-key: anyone who can reach it can use the model")
