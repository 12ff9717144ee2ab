"""The runtime, autocdc's lowest layer: a Spark session with Delta (session), the jars it
carries (jars), the class archive it maps (archive, made by dump), where its logs go
(logs), where its tables lie in the warehouse (warehouse), and the root of every autocdc
error (errors). It imports nothing else of autocdc; every other layer may import it.

Its package exports what the layers above use. ``jars``, ``archive`` and ``dump`` are not
imported here: ``python -m autocdc.runtime.jars`` must be the first import of its module.
"""

from __future__ import annotations

from autocdc.runtime.errors import (
    AutoCdcError,
    DeltaNotSubmittedError,
    JarsUnresolvedError,
    SessionError,
    raised_in_worker,
)
from autocdc.runtime.logs import LOG_FILE, log_file
from autocdc.runtime.session import spark_session
from autocdc.runtime.warehouse import has_commits

__all__ = [
    "LOG_FILE",
    "AutoCdcError",
    "DeltaNotSubmittedError",
    "JarsUnresolvedError",
    "SessionError",
    "has_commits",
    "log_file",
    "raised_in_worker",
    "spark_session",
]
