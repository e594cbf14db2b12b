"""Two "hosts" that share nothing but a veth pair: the Ray launcher relies on neither loopback nor one /dev/shm.

Host A is a network namespace holding the Ray head, the conductor and rank 0;
host B is another namespace, joined to A by one veth pair (10.213.7.1/30 <->
10.213.7.2/30, no route anywhere else), whose Ray node runs in its own mount
namespace with a private /dev/shm, and holds ranks 1 and 2. On loopback
aliases a rank that advertised 127.0.0.1, or a tensor sent through /dev/shm
to another node, would still work; here neither can, so the same assertions
as on aliases, (a)-(d) of research/ray_multihost.md §7, prove the launcher
does neither. Needs root (namespaces, veth, mounts); everything it creates is
removed at the end, every process in its namespaces killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import pytest

from tests.polling import alive, wait_for
from tests.ray.conftest import OBJECT_STORE, ray, ray_env, ray_placement
from tests.runtime.conftest import comparable_events, comparable_reference, reference
from walkserve.core.config import RuntimeConfig
from walkserve.core.finish import FinishReason
from walkserve.entrypoint.sync import Engine
from walkserve.testing.fixtures.requests import fixture_request
from walkserve.testing.netns import inside, ip, is_root
from walkserve.transport import shm

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not is_root(), reason="needs root: network namespaces, a veth pair, mounts")]

IP_A, IP_B, PORT = "10.213.7.1", "10.213.7.2", 6390
TAG = f"{os.getpid() % 100000}"
NS_A, NS_B = f"wsh-a{TAG}", f"wsh-b{TAG}"
RAY_BIN = str(Path(sys.executable).with_name("ray"))


def _ns_inode(path: str) -> int:
    return os.stat(path).st_ino


def _procs_in(inodes: set[int]) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                    out.append(int(entry))
    return out


def _make_hosts() -> None:
    veth_a, veth_b = f"wsv{TAG}a", f"wsv{TAG}b"
    ip("netns", "add", NS_A)
    ip("netns", "add", NS_B)
    ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
    ip("link", "set", veth_a, "netns", NS_A)
    ip("link", "set", veth_b, "netns", NS_B)
    for ns, dev, addr in ((NS_A, veth_a, IP_A), (NS_B, veth_b, IP_B)):
        ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "link", "set", dev, "up")


def _start_nodes(tmp: Path) -> list[subprocess.Popen]:
    common = ["--block", f"--object-store-memory={OBJECT_STORE}", "--disable-usage-stats"]
    env = {**os.environ, "RAY_TMPDIR": str(tmp / "a"), "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen(["ip", "netns", "exec", NS_A, RAY_BIN, "start", "--head", f"--node-ip-address={IP_A}",
                             f"--port={PORT}", "--num-cpus=1", "--include-dashboard=false", *common], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (tmp / "b").mkdir()
    script = (f'mount -t tmpfs -o size=512m tmpfs /dev/shm && mount -t tmpfs tmpfs "{tmp}/b" && exec "{RAY_BIN}" start '
              f'--address={IP_A}:{PORT} --node-ip-address={IP_B} --num-cpus=2 {" ".join(common)}')
    env_b = {**env, "RAY_TMPDIR": str(tmp / "b")}
    with inside(f"/run/netns/{NS_A}"):  # B joins once the head listens
        assert wait_for(lambda: _listening(IP_A, PORT), timeout=120, interval=0.2), "the Ray head did not start"
    node_b = subprocess.Popen(["ip", "netns", "exec", NS_B, "unshare", "-m", "sh", "-c", script], env=env_b,
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [head, node_b]


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def _stop(nodes: list[subprocess.Popen], inodes: set[int]) -> None:
    """SIGTERM to both ``ray start --block`` groups, then SIGKILL whatever still lives in our namespaces."""
    for p in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    if not wait_for(lambda: not _procs_in(inodes), timeout=5):
        for pid in _procs_in(inodes):  # only processes inside the namespaces this test made
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not _procs_in(inodes), timeout=10), _procs_in(inodes)
    for p in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


@pytest.fixture(scope="module")
def two_hosts():
    tmp = Path(tempfile.mkdtemp(prefix="wsns-", dir="/tmp"))
    nodes: list[subprocess.Popen] = []
    inodes: set[int] = set()
    try:
        _make_hosts()
        ns_a, ns_b = _ns_inode(f"/run/netns/{NS_A}"), _ns_inode(f"/run/netns/{NS_B}")
        inodes = {ns_a, ns_b}
        with ray_env(tmp / "a"):
            nodes = _start_nodes(tmp)
            with inside(f"/run/netns/{NS_A}"):
                ray.init(address=f"{IP_A}:{PORT}", namespace="walkserve-tests", logging_level=logging.WARNING,
                         log_to_driver=False)
                try:
                    assert wait_for(lambda: sum(n["Alive"] for n in ray.nodes()) == 2, timeout=120, interval=0.2)
                    yield ns_a, ns_b  # the namespaces' inodes
                finally:
                    ray.shutdown()
    finally:
        _stop(nodes, inodes)
        for ns in (NS_A, NS_B):
            ip("netns", "del", ns, check=False)
        subprocess.run(["umount", "-l", str(tmp / "b")], capture_output=True, check=False)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


PLACE = ray_placement(
    [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu", "host": IP_B}, {"id": 2, "device": "cpu", "host": IP_B}],
    [{"nodes": ["encode", "vae"], "ranks": [0]}, {"nodes": ["cond_text", "uncond"], "ranks": [1]},
     {"nodes": ["cond_image", "combine"], "ranks": [2]}],
)


def test_two_namespaces_each_rank_on_its_host_outputs_tensors_and_a_killed_rank(two_hosts):
    before = set(shm.segments())
    by_rank = lambda d: {int(k): v for k, v in d.items()}  # noqa: E731
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WALKSERVE_SHM_INLINE_BYTES", "0")
        engine = Engine.start("fixture-image", placement=PLACE,
                              config=RuntimeConfig(ray_address=f"{IP_A}:{PORT}", start_timeout_s=240))
    try:
        # (a) each rank on its host, bound to that host's address, in that host's namespaces
        engine.stats()
        stats = engine.status.stats
        hosts, workers, pids = stats.hosts, stats.workers, stats.pids
        assert hosts == {0: IP_A, 1: IP_B, 2: IP_B}
        assert stats.ray["conductor_address"].startswith(f"tcp://{IP_A}:")
        for rank, host in hosts.items():
            assert workers[rank].address.startswith(f"tcp://{host}:")
        ns_a, ns_b = two_hosts
        assert [os.stat(f"/proc/{pids[r]}/ns/net").st_ino for r in (0, 1, 2)] == [ns_a, ns_b, ns_b]
        host_shm = os.stat("/dev/shm").st_dev
        assert os.stat(f"/proc/{pids[1]}/root/dev/shm").st_dev != host_shm  # B has a /dev/shm of its own
        assert os.stat(f"/proc/{pids[0]}/root/dev/shm").st_dev == host_shm
        # (b) outputs equal the reference
        ref = reference("fixture-image")
        reqs = [fixture_request("fixture-image", 300 + i) for i in range(6)]
        for req, res in zip(reqs, engine.run(reqs, timeout=120), strict=True):
            assert comparable_events(res.events) == comparable_reference(ref.run(req))
        # (c) inline across the veth, shared memory inside B
        engine.stats()
        workers = engine.status.stats.workers
        assert workers[1].shm_to.get(2, 0) > 0 and workers[2].shm_to.get(1, 0) > 0
        assert not workers[0].shm_to and 0 not in workers[1].shm_to | workers[2].shm_to
        assert workers[0].inline_to.get(1, 0) > 0 and workers[2].inline_to.get(0, 0) > 0
        # (d) SIGKILL of rank 2 on B: its requests end within 1 s, it restarts, the next request is served
        long = [fixture_request("fixture-image", 600 + i) for i in range(2)]
        for r in long:
            r.params = msgspec.structs.replace(r.params, steps=400, sleep_ms=10)
        box: dict = {}
        runner = threading.Thread(target=lambda: box.update(results=engine.run(long, timeout=60)), daemon=True)
        runner.start()
        assert wait_for(lambda: engine.stats(fresh=False).running == 2, timeout=30)
        time.sleep(0.5)
        killed = time.monotonic()
        os.kill(pids[2], signal.SIGKILL)
        runner.join(timeout=30)
        elapsed = time.monotonic() - killed
        assert elapsed < 1.0, elapsed
        for r in box["results"]:
            assert r.finished.reason == FinishReason.ERROR and f"worker rank 2 died (pid {pids[2]} on {IP_B}" in r.finished.error
        assert wait_for(lambda: engine.health().ok, timeout=240)
        again = fixture_request("fixture-image", 320)
        assert comparable_events(engine.run([again], timeout=60)[0].events) == comparable_reference(ref.run(again))
        print(f"figure: netns SIGKILL of a rank on host B -> its requests ended in {elapsed * 1000:.0f} ms")
    finally:
        engine.close(drain_s=5)
    every = [*pids.values(), *by_rank(stats.ray["actor_pids"]).values()]
    assert wait_for(lambda: not any(alive(p) for p in every), timeout=10)
    assert set(shm.segments()) <= before
