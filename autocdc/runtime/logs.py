"""Where the details go, so that a terminal shows only what a user acts on.

A session writes one log file, ``autocdc-logs/autocdc.log`` beside its warehouse (or the
``autocdc.logFile`` setting): Spark's log4j output (the engine's ``log4j2.properties``),
whatever the JVM prints itself (its warnings, ivy's report when Delta's jars are resolved at
start), pyspark's JSON records of the errors it raises, py4j's warnings, and the traceback
of a failed ``autocdc`` command (``autocdc.log_file()`` names it). The file is appended to,
run after run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from pyspark.logger import PySparkLogger

LOG_FILE = "autocdc.logFile"

# pyspark logs every error it raises from the JVM, JVM stack trace included, as a JSON
# line on stderr, even when the caller catches it.
_PYSPARK_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
# py4j logs a connection broken mid-call (the JVM gone as the process ends, a call cut by
# Ctrl-C) with its traceback, which Python's last-resort handler prints on stderr.
_PY4J_LOGGER = "py4j"

_current: Path | None = None


def path_for(settings: Mapping[str, str]) -> Path:
    """``autocdc.logFile`` if set, else ``autocdc-logs/autocdc.log`` beside the warehouse
    (``spark.sql.warehouse.dir``, default ``./warehouse``)."""
    configured = settings.get(LOG_FILE)
    if configured:
        return Path(configured).resolve()
    warehouse = Path(settings.get("spark.sql.warehouse.dir") or "warehouse").resolve()
    return warehouse.parent / "autocdc-logs" / "autocdc.log"


def use(path: Path) -> None:
    """Make ``path`` this process's log file, and send pyspark's error records and py4j's
    warnings there."""
    global _current
    path.parent.mkdir(parents=True, exist_ok=True)
    _current = path
    loggers = [PySparkLogger.getLogger(name) for name in _PYSPARK_LOGGERS]
    for logger in [*loggers, logging.getLogger(_PY4J_LOGGER)]:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
        logger.addHandler(logging.FileHandler(path, delay=True))  # pyspark's: JSON lines
        logger.propagate = False


def log_file() -> Path:
    """The file this process's session logs to (else the default for ``./warehouse``):
    where to look when Spark fails."""
    return _current or path_for({})


def java_options(log4j_config: Path, path: Path) -> str:
    """The driver JVM options that make Spark log to ``path`` with ``log4j_config``."""
    return f'"-Dlog4j2.configurationFile={log4j_config}" "-D{LOG_FILE}={path}"'
