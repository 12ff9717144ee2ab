"""One run at a time: a lease file in the pipeline's storage folder.

``autocdc run`` holds ``<storage>/autocdc-run.lock`` while it runs, so a second run of the
pipeline (from this machine, or another sharing the storage) is refused with
:class:`PipelineLockedError` naming the holder. The lease is JSON: ``pipeline``, ``host``,
``pid``, ``run_id``, ``since`` and ``heartbeat`` (ISO UTC), plus ``boot_id`` and
``started`` (the process's start time), which tell whether a holder on this machine is
still alive.

- **Claim.** The content is written to a private file first, then hard-linked to the
  lease's name: ``link`` is atomic and fails when the name exists, on local file systems
  and on NFS, and nobody ever reads a half-written lease.
- **Heartbeat.** A daemon thread rewrites ``heartbeat`` in place every ``expiry / 4``
  seconds (at most every 5 s), through the descriptor of the holder's own file: it can
  never write into another run's lease.
- **Dead holders.** A claim made on this machine (same host name and boot id) whose
  process is gone (no such pid, a zombie, or a pid reused by a process started at another
  time) is taken over at once. Any other claim expires when its heartbeat is older than
  the expiry: :data:`DEFAULT_EXPIRY_SECONDS`, or ``autocdc.lock.expirySeconds`` in the
  spec's ``configuration``. Hosts sharing the storage must agree on the time to well
  within the expiry.
- **Lost lease.** If another run took the lease over (this run stalled past the expiry),
  or the heartbeat could not be written for the expiry, the holder stops: the heartbeat
  thread interrupts the main thread (SIGINT, as Ctrl-C; a lease taken in another thread
  is only checked when its block ends) and :func:`hold` raises
  :class:`PipelineLockLostError`.
- **Release.** The lease is removed when the block ends: normally, by an exception,
  Ctrl-C, or SIGTERM (turned into ``SystemExit(143)`` while held). A kill -9 leaves it,
  to be taken over as above.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.errors import PipelineLockedError, PipelineLockLostError
from autocdc.runtime import AutoCdcError

LEASE = "autocdc-run.lock"
EXPIRY_KEY = "autocdc.lock.expirySeconds"
DEFAULT_EXPIRY_SECONDS = 60.0
MAX_HEARTBEAT_SECONDS = 5.0
_ATTEMPTS = 20  # claims that vanish or go stale under us before we give up
FileId = tuple[int, int]  # (st_dev, st_ino): which file a name points at
# The error a refused claim raises, from the holder's facts (PipelineLockedError's params).
Refusal = Callable[..., AutoCdcError]


def expiry_seconds(spec: Project) -> float:
    """The spec's ``autocdc.lock.expirySeconds``, checked (call it before Spark starts)."""
    value = spec.configuration.get(EXPIRY_KEY)
    if value is None:
        return DEFAULT_EXPIRY_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        hint = f"Give a number of seconds, e.g. '{DEFAULT_EXPIRY_SECONDS:g}' (the default)."
        raise spec._error(("configuration", EXPIRY_KEY), f"{value!r} is not a duration", hint)
    return seconds


@contextlib.contextmanager
def hold(
    storage: Path | str,
    pipeline: str,
    expiry: float = DEFAULT_EXPIRY_SECONDS,
    *,
    name: str = LEASE,
    refused: Refusal = PipelineLockedError,
) -> Iterator[Lease]:
    """Hold the pipeline's run lock (or another lease of the storage: ``name``, and the
    error ``refused`` builds) for the block; raises :class:`PipelineLockedError` if
    another run holds it, :class:`PipelineLockLostError` if this run lost it meanwhile.
    A storage folder the lease had to create is removed with it if still empty: a run
    that fails before writing anything leaves nothing behind.

    >>> with hold(spec.storage_path, spec.name, expiry_seconds(spec)):  # doctest: +SKIP
    ...     runner.Runner(spark, spec, resolved).run(options)
    """
    folder = Path(storage)
    created = not folder.exists()
    lease = Lease.acquire(folder / name, pipeline, expiry, refused)
    try:
        yield lease
    except BaseException as error:
        _release(lease, folder if created else None)
        if lease.lost is not None:
            raise lease.lost from error
        raise
    _release(lease, folder if created else None)
    if lease.lost is not None:
        raise lease.lost


def _release(lease: Lease, created: Path | None) -> None:
    lease.release()
    if created is not None:
        with contextlib.suppress(OSError):  # not empty: the run wrote there
            created.rmdir()


@dataclass(frozen=True)
class Claim:
    """A lease as read, and the file it was read from."""

    fields: dict[str, Any]
    file: FileId
    heartbeat: float  # epoch seconds

    def over(self, expiry: float, now: float) -> bool:
        """Whether its holder is dead: gone from this machine, or silent for ``expiry``."""
        if now - self.heartbeat > expiry:
            return True
        if self.fields.get("host") != socket.gethostname():
            return False
        if self.fields.get("boot_id", _BOOT_ID) != _BOOT_ID:
            return True  # this machine rebooted since
        pid, started = self.fields.get("pid"), self.fields.get("started") or ""
        return isinstance(pid, int) and pid > 0 and _gone(pid, str(started))

    def refusal(self, path: Path, pipeline: str, expiry: float, refused: Refusal) -> AutoCdcError:
        now = time.time()
        since = self.fields.get("since", "?")
        try:
            ago = _duration(now - datetime.fromisoformat(since).timestamp())
        except (TypeError, ValueError):
            ago = "?"
        return refused(
            pipeline=self.fields.get("pipeline", pipeline),
            host=self.fields.get("host", "?"),
            pid=self.fields.get("pid", "?"),
            run_id=self.fields.get("run_id", "?"),
            since=since,
            ago=ago,
            heartbeat_ago=_duration(now - self.heartbeat),
            expiry=expiry,
            path=str(path),
        )


class Lease:
    """A held lease: its open file, and the heartbeat thread that keeps it fresh."""

    def __init__(self, path: Path, fd: int, fields: dict[str, Any], expiry: float) -> None:
        self.path, self.fd, self.fields, self.expiry = path, fd, fields, expiry
        self.file: FileId = _file_id(os.fstat(fd))
        self.lost: PipelineLockLostError | None = None
        self._stop = threading.Event()
        self._main = threading.current_thread() is threading.main_thread()
        self._sigterm = signal.getsignal(signal.SIGTERM) if self._main else None
        if self._sigterm == signal.SIG_DFL:  # let SIGTERM end the block, so it releases
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        # A process started with SIGINT ignored (a background job of a script) would not
        # stop when the lease is lost: the heartbeat's SIGINT must reach Python.
        self._sigint = signal.getsignal(signal.SIGINT) if self._main else None
        if self._sigint == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self._beat = threading.Thread(target=self._heartbeat, name="autocdc-lock", daemon=True)
        self._beat.start()

    @classmethod
    def acquire(
        cls, path: Path, pipeline: str, expiry: float, refused: Refusal = PipelineLockedError
    ) -> Lease:
        """Claim the lease, taking it over from a dead holder.

        Only one of several runs that see the same dead claim at once wins: a run becomes
        the holder only through its own ``link`` to the lease's name, which succeeds for
        one run while the name is free. A dead claim is removed by :func:`_remove`, which
        moves the name aside and checks that it moved the very claim it judged dead (same
        file, same run id): the
        first contender moves it; a later one finds the name empty, or moves a fresh lease
        (another contender's) and links it back unchanged, so its holder keeps it.
        Contenders remove dead claims one at a time (:func:`_takeover`) and only the claim
        they read under that lock, so a view from before another's takeover never moves
        the new holder's lease aside.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        now = time.time()
        fields = {
            "pipeline": pipeline,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_id": uuid.uuid4().hex,
            "since": _iso(now),
            "heartbeat": _iso(now),
            "boot_id": _BOOT_ID,
            "started": _started(os.getpid()),
        }
        seen: Claim | None = None
        for _ in range(_ATTEMPTS):
            fd = _create(path, _encode(fields))
            if fd is not None:
                return cls(path, fd, fields, expiry)
            claim = _read(path)
            if claim is None:
                continue  # released meanwhile
            if not claim.over(expiry, time.time()):
                raise claim.refusal(path, pipeline, expiry, refused)
            with _takeover(path):  # one contender at a time, on a view read under it
                now_held = _read(path)
                dead = (claim.file, claim.fields.get("run_id"))
                if now_held is not None and (now_held.file, now_held.fields.get("run_id")) == dead:
                    _remove(path, claim.file, claim.fields.get("run_id"))
            seen = claim
        assert seen is not None, f"{path} kept vanishing"
        raise seen.refusal(path, pipeline, expiry, refused)  # a stream of dead claims: give up

    @property
    def interval(self) -> float:
        return min(MAX_HEARTBEAT_SECONDS, self.expiry / 4)

    def release(self) -> None:
        """Stop the heartbeat and remove the lease (unless it went to another run)."""
        self._stop.set()
        self._beat.join()
        if self._sigterm == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self._sigint == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.lost is None:
            with contextlib.suppress(OSError):
                _remove(self.path, self.file, self.fields["run_id"])
        os.close(self.fd)

    def _heartbeat(self) -> None:
        refreshed = time.monotonic()
        while not self._stop.wait(self.interval):
            try:
                owner = _owner(self.path)
                if owner == self.file:
                    self.fields["heartbeat"] = _iso(time.time())
                    content = _encode(self.fields)
                    os.pwrite(self.fd, content, 0)
                    os.ftruncate(self.fd, len(content))
                    os.fsync(self.fd)
                    refreshed = time.monotonic()
                    continue
                failure = "the lease file was removed"
                if owner is not None:
                    claim = _read(self.path)
                    by = claim.fields if claim else {}
                    self._lose(
                        f"run {by.get('run_id')} (host {by.get('host')}, pid {by.get('pid')}) "
                        f"took it over at {by.get('since')}"
                    )
                    return
            except OSError as error:
                failure = str(error)
            if time.monotonic() - refreshed > self.expiry:
                self._lose(f"its heartbeat could not be written for the expiry ({failure})")
                return

    def _lose(self, why: str) -> None:
        self.lost = PipelineLockLostError(
            pipeline=self.fields["pipeline"], path=str(self.path), why=why, expiry=self.expiry
        )
        if self._main and not self._stop.is_set():
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def _create(path: Path, content: bytes) -> int | None:
    """Claim the free name ``path``; returns the lease's open descriptor, or None when the
    name is taken."""
    private = path.with_name(f".{path.name}.{uuid.uuid4().hex}.new")
    fd = os.open(private, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, content)
        os.fsync(fd)
        try:
            os.link(private, path)
        except FileExistsError:
            # NFS: a retried link reports EEXIST although the first one succeeded
            if os.fstat(fd).st_nlink != 2:
                os.close(fd)
                return None
    except BaseException:
        os.close(fd)
        raise
    finally:
        private.unlink(missing_ok=True)
    return fd


@contextlib.contextmanager
def _takeover(path: Path) -> Iterator[None]:
    """Serialize the removal of dead claims: an exclusive ``flock`` on a side file, removed
    when the block ends. Without it, a contender acting on a view from before another's
    takeover moved the new holder's lease aside to check it, and a third run could link
    into the name meanwhile: two runs held the lease until the next heartbeat (seen in
    CI). The side file is locked only while it is the file its name points at (a
    contender that opened it just before its removal tries again)."""
    side = path.with_name(f".{path.name}.takeover")
    while True:
        fd = os.open(side, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _file_id(os.fstat(fd)) == _file_id(os.stat(side)):
                break
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        side.unlink(missing_ok=True)
        os.close(fd)


def _remove(path: Path, file: FileId, run_id: str | None) -> None:
    """Remove the lease if the name still points at ``file``, the lease of ``run_id``.
    ``rename`` moves whatever the name holds at that instant, so the moved file is checked,
    and put back with a hard link when it is another (the same file: its holder still owns
    it). The run id is checked too: a dead claim's file, once deleted, may lend its inode
    number to the next lease."""
    aside = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        if not aside.exists():  # NFS: a retried rename may report the first one's success
            return
    try:
        moved = _read(aside)
        if moved is not None and (moved.file, moved.fields.get("run_id")) != (file, run_id):
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
    finally:
        aside.unlink(missing_ok=True)


def _read(path: Path) -> Claim | None:
    """The claim on ``path``, or None if there is none. It is read twice: a read torn by a
    heartbeat rewriting the file could show a mix of two times, so it is read again until
    two reads agree; a lease that stays unreadable is judged by its file's age."""
    for _ in range(5):
        try:
            with open(path, "rb") as f:
                stat, data = os.fstat(f.fileno()), f.read()
                again = os.pread(f.fileno(), len(data) + 1, 0)
        except FileNotFoundError:
            return None
        try:
            if again != data:
                raise ValueError("torn read")
            fields = json.loads(data)
            beat = datetime.fromisoformat(fields["heartbeat"]).timestamp()
            return Claim(fields, _file_id(stat), beat)
        except (ValueError, KeyError, TypeError):
            time.sleep(0.05)
    return Claim({"since": _iso(stat.st_mtime)}, _file_id(stat), stat.st_mtime)


def _owner(path: Path) -> FileId | None:
    """The file the lease's name points at. Missing is asked twice: a contender that moved
    the lease aside by mistake puts it back at once (see :func:`_remove`)."""
    for pause in (0.2, 0):
        try:
            return _file_id(os.stat(path))
        except FileNotFoundError:
            time.sleep(pause)
    return None


def _gone(pid: int, started: str) -> bool:
    """Whether process ``pid`` of this machine, started at ``started``, has ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # another user's process: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return False  # no /proc (macOS): the pid exists, so assume it is the holder
    return stat[0] == "Z" or (bool(started) and stat[19] != started)


def _started(pid: int) -> str:
    """A process's start time, in clock ticks since boot ('' without /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except OSError:
        return ""


def _read_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


_BOOT_ID = _read_boot_id()


def _exit_on_sigterm(number: int, _frame: object) -> None:
    raise SystemExit(128 + number)


def _encode(fields: dict[str, Any]) -> bytes:
    """Always the same length for one run (fixed-width times), so a heartbeat rewrites
    the lease in place."""
    return (json.dumps(fields, indent=1) + "\n").encode()


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")


def _file_id(stat: os.stat_result) -> FileId:
    return stat.st_dev, stat.st_ino


def _duration(seconds: float) -> str:
    """``3 s``, ``4 min 2 s``, ``2 h 5 min``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
