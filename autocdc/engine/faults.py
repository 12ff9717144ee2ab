"""Fault injection for the kill tests: SIGKILL this process at a named step."""

from __future__ import annotations

import os
import signal

CRASH_ENV = "AUTOCDC_TEST_CRASH_AT"


def crash_point(name: str) -> None:
    """Die here when ``$AUTOCDC_TEST_CRASH_AT`` names this step."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
