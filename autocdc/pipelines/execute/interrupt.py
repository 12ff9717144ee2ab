"""Ctrl-C (SIGINT) during ``autocdc run``: one line, the lock released, nothing lost.

pyspark's own SIGINT handler cancels the jobs through py4j from inside whatever py4j
call the main thread was in, then raises KeyboardInterrupt there: the connection's reader
is re-entered and some 90 lines of py4j tracebacks follow. pyspark installs it when a
SparkContext starts in the main thread, so :func:`start` starts the session in a helper
thread while the main thread waits where Ctrl-C ends the run at once (the JVM's start
takes many seconds). Inside :func:`noted` the signal is then only noted; a helper thread (on
a py4j connection of its own) stops the streaming queries and cancels running jobs, so
the main thread's call returns, and :func:`check` raises KeyboardInterrupt at the next
point where the run can end cleanly. Stopping a query mid-batch is as safe as a crash
there (see :mod:`autocdc.engine.commit`). Another Ctrl-C some seconds later raises at
once.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from pyspark.sql import SparkSession

_requested = threading.Event()
_watched: list[SparkSession] = []  # inside noted(): the session to stop, once there is one
_inside = threading.Event()
_first: list[float] = []  # when the first Ctrl-C came
INSIST_AFTER_SECONDS = 2.0  # a later Ctrl-C raises at once


@contextlib.contextmanager
def noted(spark: SparkSession | None = None) -> Iterator[None]:
    """Ctrl-C is noted, not raised, inside the block (when run in the main thread); the
    handler from before (pyspark's own, in a notebook) is put back after. ``spark``: the
    session whose work Ctrl-C stops (else the one :func:`start` opens). Inside a block
    of its own, it only watches ``spark``."""
    if threading.current_thread() is not threading.main_thread() or _inside.is_set():
        if spark is not None and _inside.is_set():
            _watched[:] = [spark]
        yield
        return
    before = signal.signal(signal.SIGINT, _noted)
    _inside.set()
    _watched[:] = [spark] if spark is not None else []
    try:
        yield
    except Exception as error:
        if _requested.is_set():  # a cancelled job, a stopped query: the interruption
            raise KeyboardInterrupt from error
        raise
    finally:
        signal.signal(signal.SIGINT, before)
        _inside.clear()
        _requested.clear()
        _watched.clear()


def start(open_session: Callable[[], SparkSession]) -> SparkSession:
    """The session ``open_session`` starts, watched: inside :func:`noted`, Ctrl-C stops its
    work from then on. While it starts (in a helper thread, where pyspark installs no
    SIGINT handler of its own) Ctrl-C raises KeyboardInterrupt here at once; the JVM, a
    child reading a pipe from this process, ends with it."""
    if not _inside.is_set():
        return open_session()
    opened: list[SparkSession | BaseException] = []

    def opening() -> None:
        try:
            opened.append(open_session())
        except BaseException as error:  # raised in the main thread below
            opened.append(error)

    thread = threading.Thread(target=opening, name="autocdc-session", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
        check()
    if isinstance(opened[0], BaseException):
        raise opened[0]
    spark = opened[0]
    # The JVM keeps the active session per thread: make it this thread's too (Delta's
    # catalog resolves tables through it).
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    _watched[:] = [spark]
    check()
    return spark


def _noted(_signum: int, _frame: FrameType | None) -> None:
    if _requested.is_set():
        if time.monotonic() - _first[0] > INSIST_AFTER_SECONDS:
            raise KeyboardInterrupt
        return  # the same Ctrl-C again (sent to the process and to its group)
    _first[:] = [time.monotonic()]
    _requested.set()
    threading.Thread(target=_halt, name="autocdc-interrupt", daemon=True).start()


def _halt() -> None:
    for spark in list(_watched):
        with contextlib.suppress(Exception):  # the session may be stopping by itself
            for query in spark.streams.active:
                query.stop()
            spark.sparkContext.cancelAllJobs()


def active() -> bool:
    """Whether Ctrl-C is being noted (inside :func:`noted`)."""
    return _inside.is_set()


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """Raise KeyboardInterrupt here if Ctrl-C was pressed."""
    if _requested.is_set():
        raise KeyboardInterrupt


def sleep(seconds: float) -> None:
    """Wait ``seconds`` (a flow's pause before another attempt), Ctrl-C ending it at once."""
    _requested.wait(seconds)
    check()


JVM_EXIT_SECONDS = 10.0  # how long a stopped command waits for its JVM to exit


def release_jvm(timeout: float = JVM_EXIT_SECONDS) -> bool:
    """Stop the session and end the JVM this process started, waiting for it at most
    ``timeout`` seconds; whether it is gone (True also when there is none of ours: not
    started yet, or spark-submit's). Without this a command stopped by Ctrl-C exits first
    and its JVM lingers some seconds, a process the user did not expect. The context is
    stopped first (a JVM gone under a running py4j call logs its traceback), then the
    JVM's gateway exits when its stdin closes (pyspark's pipe, for a Python that dies)."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:
        return True
    # A thread still inside a py4j call as the JVM goes (a job's, a snapshot's warm-up)
    # has py4j report it with `logging.exception`, which gives the bare root logger a
    # stderr handler: the command has said how it stopped, so the root logger gets one
    # that writes nothing.
    logging.getLogger().addHandler(logging.NullHandler())
    context = SparkContext._active_spark_context
    if context is not None:
        with contextlib.suppress(Exception):  # the JVM may be ending by itself
            context.stop()
    with contextlib.suppress(OSError):  # already closed: the JVM is ending
        proc.stdin.close()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True
