"""Fault injection for the kill tests: SIGKILL this process at a named step."""

from __future__ import annotations

import os
import signal
from collections import Counter

CRASH_ENV = "AUTOCDC_TEST_CRASH_AT"
_passed: Counter[str] = Counter()


def crash_point(name: str) -> None:
    """Die here when ``$AUTOCDC_TEST_CRASH_AT`` names this step: ``step``, or ``step@n``
    to die the n-th time the process reaches it (a later flow's apply, say)."""
    wanted, _, nth = os.environ.get(CRASH_ENV, "").partition("@")
    if wanted != name:
        return
    _passed[name] += 1
    if _passed[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
