"""Fault injection for the kill and retry tests: SIGKILL this process at a named step, or
fail a named step a few times with an error that is not autocdc's own."""

from __future__ import annotations

import os
import signal
from collections import Counter

CRASH_ENV = "AUTOCDC_TEST_CRASH_AT"
FAIL_ENV = "AUTOCDC_TEST_FAIL_AT"
_passed: Counter[str] = Counter()
_failed: Counter[str] = Counter()


class InjectedFault(RuntimeError):
    """A transient failure a test asked for (``$AUTOCDC_TEST_FAIL_AT``)."""


def crash_point(name: str) -> None:
    """Die here when ``$AUTOCDC_TEST_CRASH_AT`` names this step: ``step``, or ``step@n``
    to die the n-th time the process reaches it (a later flow's apply, say)."""
    wanted, _, nth = os.environ.get(CRASH_ENV, "").partition("@")
    if wanted != name:
        return
    _passed[name] += 1
    if _passed[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def fail_point(name: str) -> None:
    """Raise :class:`InjectedFault` here when ``$AUTOCDC_TEST_FAIL_AT`` names this step:
    ``step`` the first time the process reaches it, ``step@n`` the first n times."""
    wanted, _, times = os.environ.get(FAIL_ENV, "").partition("@")
    if wanted != name or _failed[name] >= int(times or 1):
        return
    _failed[name] += 1
    raise InjectedFault(f"injected fault at {name} ({_failed[name]} of {times or 1})")
