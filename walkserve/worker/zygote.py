"""The worker zygote: one interpreter that imports torch and the model code once, then forks workers.

``python -m walkserve.worker.zygote SPEC_FILE PARENT_PID`` says ``ready``,
then reads ``fork <rank>`` lines on stdin and answers ``forked <rank> <pid>``;
a worker's end is reported as ``exit <pid> <returncode>`` (the pipe's
messages are in ``protocol/zygote.py``).

Forking a warm interpreter makes a worker start in milliseconds instead of
seconds (importing torch dominates), and a crashed worker restarts as fast.
The zygote never initialises CUDA or runs a torch op, so forking is safe;
each worker initialises its own device after the fork.
"""

from __future__ import annotations

import os
import select
import signal
import sys

from walkserve.core.proc import die_with_parent, set_title
from walkserve.protocol.run import load_run_spec
from walkserve.protocol.zygote import Exited, Fork, Forked, Ready, decode_line, encode_line


def _warm(spec) -> None:
    import torch  # noqa: F401

    import walkserve.engines.registry
    import walkserve.engines.stateless
    import walkserve.models.builtin
    import walkserve.worker.worker  # noqa: F401
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model

    load_model(ModelRef(spec.model_family, spec.model_path, spec.model_options)).graph()


def _child(spec, rank: int, wake: tuple[int, int]) -> None:
    os.dup2(2, 1)  # the command pipe is the zygote's; worker output goes to stderr
    os.close(0)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in wake:
        os.close(fd)
    code = 0
    try:
        from walkserve.worker.main import worker_main

        worker_main(spec, rank, os.getppid())
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)


def _reap(out) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        out.write(encode_line(Exited(pid, code)))
        out.flush()


def main(argv: list[str]) -> int:
    spec = load_run_spec(argv[1])
    set_title(f"walkserve: worker zygote ({spec.model_family})")
    die_with_parent(int(argv[2]), use_pdeathsig=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _warm(spec)
    out = sys.stdout.buffer
    out.write(encode_line(Ready()))
    out.flush()
    stdin = sys.stdin.buffer
    # A worker's exit wakes the select at once (a SIGCHLD handler makes Python write to the wake-up pipe), so the
    # conductor hears of it without waiting out the select's timeout.
    wake = os.pipe()
    os.set_blocking(wake[1], False)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    buf = b""
    while True:
        ready, _, _ = select.select([stdin, wake[0]], [], [], 0.2)
        if wake[0] in ready:
            os.read(wake[0], 4096)
        _reap(out)
        if stdin not in ready:
            continue
        chunk = os.read(stdin.fileno(), 4096)
        if not chunk:  # the conductor closed the pipe
            sys.stderr.flush()
            # Nothing here needs finalizing, and tearing down an interpreter that imported torch takes
            # ~0.5 s: every runtime's shutdown waited for it.
            os._exit(0)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            msg = decode_line(line)
            if isinstance(msg, Fork):
                pid = os.fork()
                if pid == 0:
                    _child(spec, msg.rank, wake)
                out.write(encode_line(Forked(msg.rank, pid)))
                out.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
