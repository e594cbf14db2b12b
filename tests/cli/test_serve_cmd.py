"""``walkserve serve``: model resolution, the embedded checkpoint's write protocol, flags, one-line errors,
the ready banner, and a stop signal while the runtime starts. (Serving itself: tests/api/test_real_engine_*.)"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.api.real_server import OutputReader, alive, descendants, segments_of, start_cli, wait_for
from walkserve.cli import embedded
from walkserve.cli.main import build_parser, main
from walkserve.cli.placement_arg import placement_path, shipped_placements
from walkserve.cli.serve_banner import base_url, ready_banner, routes_for, try_command
from walkserve.cli.serve_cmd import bind, one_line, runtime_config, server_config
from walkserve.cli.serve_target import ORPHEUS_MIN_VOCAB, resolve_target
from walkserve.core.errors import ConfigError, PlacementError
from walkserve.models.llama.tiny import write_tiny
from walkserve.models.processor import ModelCard


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return write_tiny("llama", tmp_path_factory.mktemp("serve-cli") / "tiny-llama", seed=5)


@pytest.fixture(scope="module")
def orpheus_lm(tmp_path_factory, llama_dir) -> Path:
    """An Orpheus-shaped LM directory (only its config.json: resolution reads nothing else)."""
    lm = tmp_path_factory.mktemp("orpheus-lm") / "lm"
    lm.mkdir()
    config = json.loads((llama_dir / "config.json").read_text())
    (lm / "config.json").write_text(json.dumps({**config, "vocab_size": 156940}))
    return lm


@pytest.fixture(autouse=True)
def quiet_env(monkeypatch):
    monkeypatch.setenv("WALKSERVE_LOG_LEVEL", "WARNING")  # serve's run() would otherwise set it for the process


def test_no_model_means_the_embedded_orpheus(tmp_path):
    target = resolve_target(None, None, None, cache_dir=tmp_path)
    assert (target.family, target.embedded) == ("orpheus", True)
    assert target.path == str(tmp_path / "embedded" / embedded.EMBEDDED_NAME)
    assert target.ref().options == {"model_id": embedded.EMBEDDED_NAME}
    assert resolve_target(None, None, None, model_id="demo", cache_dir=tmp_path).options["model_id"] == "demo"


def test_auto_reads_the_family_from_the_checkpoint(tmp_path, llama_dir, orpheus_lm):
    for model in (None, "auto"):
        target = resolve_target(model, str(llama_dir), None)
        assert (target.family, target.detected, target.path) == ("llama", True, str(llama_dir.resolve()))
    qwen = write_tiny("qwen3", tmp_path / "q", seed=1)
    assert resolve_target(None, str(qwen), None).family == "qwen3"
    snac = tmp_path / "snac"
    snac.mkdir()
    both = resolve_target(None, str(orpheus_lm), str(snac))
    assert both.family == "orpheus" and both.options["snac_path"] == str(snac.resolve())
    (orpheus_lm.parent / "snac").mkdir(exist_ok=True)
    assert resolve_target(None, str(orpheus_lm.parent), None).family == "orpheus"  # lm/ + snac/ layout
    assert resolve_target("llama", str(llama_dir), None, model_id="x").options == {"model_id": "x"}


@pytest.mark.parametrize(("model", "path", "snac", "message"), [
    ("foo", "llama", None, "unknown model family 'foo'"),
    ("llama", None, None, "needs its checkpoint: --model-path"),
    ("llama", "missing", None, "no such directory"),
    (None, "llama", "llama", "not an Orpheus LM: its vocabulary (512 ids)"),
    ("qwen2", "llama", "llama", "--snac-path is an Orpheus option"),
    (None, None, "llama", "--snac-path needs the Orpheus LM too"),
    (None, "orpheus", None, "looks like an Orpheus LM"),
    ("orpheus", "orpheus", None, "add --snac-path"),
    (None, "empty", None, "no config.json"),
])
def test_resolution_errors(tmp_path, llama_dir, orpheus_lm, model, path, snac, message):
    dirs = {"llama": llama_dir, "orpheus": orpheus_lm, "missing": tmp_path / "nope", "empty": tmp_path}
    as_arg = {k: str(v) for k, v in dirs.items()}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_target(model, as_arg.get(path), as_arg.get(snac))
    assert ORPHEUS_MIN_VOCAB == 128266 + 7 * 4096


def test_embedded_checkpoint_is_written_atomically_and_reused(tmp_path, monkeypatch):
    """Three starts at once: whenever the final directory exists it is complete; one copy survives."""
    final = embedded.embedded_dir(tmp_path)
    calls, half_seen, done = [], [], threading.Event()

    def slow_writer(out, lm, snac, seed):
        calls.append(out)
        for name in embedded._REQUIRED:
            (Path(out) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(out) / name).write_text(name)
            time.sleep(0.05)

    def watch():
        while not done.is_set():
            if final.exists() and not embedded.is_complete(final):
                half_seen.append(sorted(str(p) for p in final.rglob("*")))
            time.sleep(0.002)

    monkeypatch.setattr("walkserve.models.orpheus.tiny.write_tiny_orpheus", slow_writer)
    watcher = threading.Thread(target=watch)
    watcher.start()
    results = []
    starts = [threading.Thread(target=lambda: results.append(embedded.ensure_embedded(tmp_path))) for _ in range(3)]
    for t in starts:
        t.start()
    for t in starts:
        t.join()
    done.set()
    watcher.join()
    assert half_seen == []
    assert len(results) == 3 and {path for path, _ in results} == {final} and embedded.is_complete(final)
    assert sorted(p.name for p in final.parent.iterdir()) == [embedded.EMBEDDED_NAME]  # no temp dir left
    assert embedded.ensure_embedded(tmp_path) == (final, False)  # the next start reuses it
    assert len(calls) == 3


def test_an_incomplete_embedded_directory_is_replaced(tmp_path, monkeypatch):
    final = embedded.embedded_dir(tmp_path)
    (final / "lm").mkdir(parents=True)
    (final / "lm" / "config.json").write_text("{}")  # a crash outside the protocol left this

    def fake_writer(out, lm, snac, seed):
        for name in embedded._REQUIRED:
            (Path(out) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(out) / name).write_text("x")

    monkeypatch.setattr("walkserve.models.orpheus.tiny.write_tiny_orpheus", fake_writer)
    assert embedded.ensure_embedded(tmp_path) == (final, True) and embedded.is_complete(final)


def test_flags_map_onto_the_configs(monkeypatch):
    monkeypatch.setenv("WALKSERVE_API_KEY", "from-env")
    args = build_parser().parse_args([
        "serve", "--port", "9000", "--max-n", "3", "--drain-timeout", "5", "--default-max-tokens", "70",
        "--media-allowlist", "https://example.com/", "--model-alias", "a", "--max-running", "4",
        "--max-waiting", "0", "--dtype", "bfloat16", "--kv-blocks", "64", "--start-timeout", "9", "--no-cohorts",
        "--ray-address", "10.0.0.7:6379", "--stream-scheduling", "fifo",
    ])
    config = server_config(args)
    assert (config.port, config.max_n, config.drain_timeout_s, config.default_max_tokens) == (9000, 3, 5.0, 70)
    assert config.api_key == "from-env" and config.model_aliases == ("a",)
    assert config.media_allowlist == ("https://example.com/",) and config.host == "127.0.0.1"
    runtime = runtime_config(args)
    assert (runtime.max_running, runtime.max_waiting, runtime.dtype) == (4, 0, "bfloat16")
    assert runtime.cohorts is False and runtime_config(build_parser().parse_args(["serve"])).cohorts is True
    assert runtime.engine_options == {"kv": {"num_blocks": 64}} and runtime.start_timeout_s == 9
    assert runtime.ray_address == "10.0.0.7:6379" and runtime_config(build_parser().parse_args(["serve"])).ray_address is None
    assert runtime.stream_scheduling.mode == "fifo"
    assert runtime_config(build_parser().parse_args(["serve"])).stream_scheduling.mode == "deadline"
    assert server_config(build_parser().parse_args(["serve", "--api-key", "k"])).api_key == "k"
    ws = server_config(build_parser().parse_args(["serve", "--max-ws-message-bytes", "4096"]))
    assert ws.max_ws_message_bytes == 4096


def test_timelines_are_kept_by_default_and_flags_set_them():
    default = runtime_config(build_parser().parse_args(["serve"]))
    assert (default.timelines, default.trace_dir) == (100, None)
    runtime = runtime_config(build_parser().parse_args(["serve", "--timelines", "0", "--trace-dir", "/tmp/traces"]))
    assert (runtime.timelines, runtime.trace_dir) == (0, "/tmp/traces")


def _run_serve(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(["serve", *argv])
    return rc, capsys.readouterr().err


def test_errors_are_one_line_with_exit_code_1(tmp_path, llama_dir, capsys):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("ranks: [\n")
    cases = [
        (["nope", "--model-path", str(llama_dir)], "unknown model family 'nope'"),
        (["--model-path", str(tmp_path / "missing")], "no such directory"),
        (["--model-path", str(llama_dir), "--config", str(tmp_path / "none.yaml")], "no such placement file"),
        (["--model-path", str(llama_dir), "--config", str(bad_yaml)], "not valid YAML"),
        (["--model-path", str(llama_dir), "--default-max-tokens", "0"], "--default-max-tokens must be"),
        (["--model-path", str(llama_dir), "--max-running", "0"], "--max-running must be >= 1"),
        (["--model-path", str(llama_dir), "--port", "70000"], "--port must be in"),
    ]
    for argv, message in cases:
        rc, err = _run_serve(argv, capsys)
        assert rc == 1, argv
        assert err.count("\n") == 1 and err.startswith("walkserve: error: ") and message in err, err
        assert "Traceback" not in err


def test_a_busy_port_fails_before_anything_starts(llama_dir, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc, err = _run_serve(["--model-path", str(llama_dir), "--port", str(port)], capsys)
    assert rc == 1 and f"cannot listen on 127.0.0.1:{port}" in err and err.count("\n") == 1


def test_connections_on_the_served_socket_send_small_writes_at_once():
    """asyncio turns Nagle's algorithm off only for sockets that name TCP: else an answer written in two parts
    (head, body) waits 40 ms for the client's delayed ACK (a 429 took 50-70 ms, /health 44 ms)."""
    import asyncio

    sock = bind("127.0.0.1", 0)
    sock.listen()

    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connection, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            value = await asyncio.wait_for(seen, 10)
            writer.close()
            return value

    assert asyncio.run(accepted_nodelay()) != 0


@pytest.mark.slow  # serve starts the runtime's processes
def test_a_checkpoint_that_fails_to_load_names_the_cause(tmp_path, llama_dir, capsys):
    """A worker that cannot build its component: the one error line says why (not just 'rank 0 died')."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(llama_dir, broken)
    tensors = load_file(str(llama_dir / "model.safetensors"))
    missing = next(k for k in sorted(tensors) if "layers.1.mlp" in k)
    del tensors[missing]
    save_file(tensors, str(broken / "model.safetensors"))
    rc, err = _run_serve(["--model-path", str(broken), "--port", "0", "--log-level", "error"], capsys)
    assert rc == 1 and err.count("\n") == 1, err
    assert "the runtime did not start" in err and f"missing tensor(s) '{missing}'" in err, err


def test_placements_by_path_or_shipped_name(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("ranks: []\n")
    assert placement_path(str(own)) == own
    names = shipped_placements()
    assert "orpheus-split" in names and "orpheus-colocated" in names
    assert placement_path("orpheus-split").name == "orpheus-split.yaml"
    with pytest.raises(PlacementError, match=r"shipped placements: .*orpheus-colocated, orpheus-split"):
        placement_path("nope")


def test_one_line_names_flags():
    assert one_line("ServerConfig.max_n must be\n  positive") == "--max-n must be positive"
    assert one_line("max_waiting must be >= 0, got -1") == "--max-waiting must be >= 0, got -1"


def test_banner_routes_and_a_working_command():
    speech = ModelCard("o", "orpheus", frozenset({"speech", "audio_out", "generate"}), default_voice="tara")
    chat = ModelCard("l", "llama", frozenset({"completions", "chat", "generate"}))
    assert "POST /v1/audio/speech" in routes_for(speech) and "POST /v1/chat/completions" not in routes_for(speech)
    assert {"POST /v1/completions", "POST /v1/chat/completions", "POST /v1/generate"} <= set(routes_for(chat))
    assert "POST /v1/audio/transcriptions" not in routes_for(chat)
    hears = ModelCard("q", "qwen3-omni", frozenset({"completions", "chat", "generate", "audio_in"}))
    assert {"POST /v1/audio/transcriptions", "POST /v1/audio/translations", "WS /v1/realtime"} <= set(routes_for(hears))
    assert "WS /v1/realtime" not in routes_for(chat)
    line = try_command(speech, "http://127.0.0.1:8000", auth=False)
    assert "/v1/audio/speech" in line and '"voice": "tara"' in line and line.endswith("-o out.wav")
    authed = try_command(chat, "http://127.0.0.1:8000", auth=True)
    assert "/v1/chat/completions" in authed and "Bearer $WALKSERVE_API_KEY" in authed
    assert base_url("0.0.0.0", 80) == "http://127.0.0.1:80" and base_url("::", 81) == "http://[::1]:81"
    assert try_command(ModelCard("n", "x", frozenset()), "http://h", False) is None


def test_banner_points_at_the_playground():
    card = ModelCard("o", "orpheus", frozenset({"speech"}))
    banner = ready_banner(card, "http://127.0.0.1:8000", auth=False, startup_s=1.0)
    assert "  browse: http://127.0.0.1:8000/ (the playground)" in banner.splitlines()
    assert "GET /" in routes_for(card)


def test_sigterm_while_starting_stops_everything(llama_dir, tmp_path):
    """A stop signal before the runtime is ready: exit 130 at once, no process or shared memory left."""
    process = start_cli(["--model-path", str(llama_dir), "--port", "0"])
    output = OutputReader(process)
    try:
        assert wait_for(lambda: "starting workers" in output.text(), 60), output.text()
        children = wait_for(lambda: descendants(process.pid), 10)
        assert children, "the conductor should be running"
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 130
        output.join()
        assert "interrupted while starting" in output.text() and "Traceback" not in output.text()
        assert wait_for(lambda: not [p for p in children if alive(p)], 10)
        assert segments_of(process.pid) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_stream_admission_flags_map_onto_the_configs():
    args = build_parser().parse_args([
        "serve", "--admission", "count", "--stream-headroom", "0.6", "--stream-ttfa-budget", "0.5",
        "--max-streams", "3", "--stream-warmup", "2", "--stream-startup-buffer", "0.4",
    ])
    runtime = runtime_config(args)
    assert (runtime.admission, runtime.stream_headroom, runtime.stream_ttfa_budget_s) == ("count", 0.6, 0.5)
    assert (runtime.max_streams, runtime.stream_warmup) == (3, 2)
    assert server_config(args).stream_startup_buffer_s == 0.4
    default = runtime_config(build_parser().parse_args(["serve"]))
    assert (default.admission, default.stream_headroom, default.max_streams) == ("capacity", 0.8, 0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--admission", "fifo"])
    for bad in (["--stream-headroom", "1.5"], ["--stream-warmup", "0"], ["--max-streams", "-1"]):
        with pytest.raises(ConfigError):
            runtime_config(build_parser().parse_args(["serve", *bad]))
