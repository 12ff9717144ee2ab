"""The processes tests start: a crash worker applying batches, ``autocdc run``, a holder
of a pipeline's lease. Each runs this tree's autocdc (the repository root goes first on
its PYTHONPATH, not whatever is installed, such as another worktree's editable install)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from autocdc.engine.faults import CRASH_ENV
from autocdc.pipelines.execute import lock

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("crash_worker.py")
# argv: storage, expiry, seconds to hold, lease name; prints "held" once it holds the lease
HOLDER = """
import sys, time
from autocdc.pipelines.execute import lock
with lock.hold(sys.argv[1], "shop", float(sys.argv[2]), name=sys.argv[4]):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def error_tail(text: str, lines: int = 30) -> str:
    """The end of a failed process's output without the JVM's stack frames and INFO
    chatter: the Python traceback and the exceptions' messages are what a report needs."""
    kept = [
        line
        for line in text.splitlines()
        if not line.lstrip().startswith(("at ", "... ")) and " INFO " not in line
    ]
    return "\n".join(kept[-lines:])


def child_env(crash_at: str | None = None) -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH, killed at the crash
    point ``crash_at`` if given (never at one inherited from this process)."""
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if crash_at:
        env[CRASH_ENV] = crash_at
    return env


def run_worker(
    warehouse: Path,
    target: str,
    batch: list[tuple] | dict[str, Any],
    crash_at: str | None,
    scd_type: int = 1,
) -> int:
    """Apply ``batch`` (or ``{"batches": [...]}``, in turn, maybe after a ``"before"``
    target's batches: see crash_worker.py) in a fresh process, which is killed at
    ``crash_at`` (during the last batch) if given; return its exit code."""
    done = subprocess.run(
        [sys.executable, str(WORKER), str(warehouse), target, json.dumps(batch), str(scd_type)],
        env=child_env(crash_at),
        cwd=WORKER.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, -signal.SIGKILL), error_tail(done.stderr)
    return done.returncode


def start(spec: Path, crash_at: str | None, *args: str) -> subprocess.Popen:
    """``autocdc run`` of ``spec`` (with ``args``), killed at the crash point ``crash_at``."""
    return subprocess.Popen(
        [sys.executable, "-m", "autocdc", "run", "--spec", str(spec), *args],
        env=child_env(crash_at),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, kill_after: float | None = None) -> int:
    """The exit code of ``proc`` (SIGKILLed after ``kill_after`` seconds if given), which
    must have finished or been killed."""
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode in (0, -signal.SIGKILL), output[-3000:]
    return proc.returncode


def start_holder(
    storage: Path,
    expiry: float,
    seconds: float = 120,
    sigint_ignored: bool = False,
    name: str = lock.LEASE,
) -> subprocess.Popen:
    """A process holding the lease (the run's, or another of the storage: ``name``;
    started with SIGINT ignored, as a script's background job is, if ``sigint_ignored``);
    returns once it holds it."""
    args = [sys.executable, "-c", HOLDER, str(storage), str(expiry), str(seconds), name]
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    proc = subprocess.Popen(
        args, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ignore
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n", proc.stderr
    return proc


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` now (Linux: from /proc), e.g. a command's JVM."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (name) state ppid ...": the name may hold spaces, split after it.
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (an exited one nobody reaped yet does not)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
