"""Where the details go, so that a terminal shows only what a user acts on.

A session writes one log file, ``autocdc-logs/autocdc.log`` beside its warehouse (or the
``autocdc.logFile`` setting): Spark's log4j output (``conf/log4j2.properties``), whatever
the JVM prints itself (its warnings, ivy's report when Delta's jars are resolved at start),
pyspark's JSON records of the errors it raises, and the traceback of a failed ``autocdc``
command. The file is appended to, run after run.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pyspark.logger import PySparkLogger

LOG_FILE = "autocdc.logFile"

# pyspark logs every error it raises from the JVM, JVM stack trace included, as a JSON
# line on stderr, even when the caller catches it.
_PYSPARK_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")

_current: Path | None = None


def log_file(settings: Mapping[str, str]) -> Path:
    """``autocdc.logFile`` if set, else ``autocdc-logs/autocdc.log`` beside the warehouse
    (``spark.sql.warehouse.dir``, default ``./warehouse``)."""
    configured = settings.get(LOG_FILE)
    if configured:
        return Path(configured).resolve()
    warehouse = Path(settings.get("spark.sql.warehouse.dir") or "warehouse").resolve()
    return warehouse.parent / "autocdc-logs" / "autocdc.log"


def use(path: Path) -> None:
    """Make ``path`` this process's log file, and send pyspark's error records there."""
    global _current
    path.parent.mkdir(parents=True, exist_ok=True)
    _current = path
    for name in _PYSPARK_LOGGERS:
        logger = PySparkLogger.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
        logger.addHandler(logging.FileHandler(path, delay=True))  # JSON, as pyspark writes
        logger.propagate = False


def current() -> Path:
    """The log file of this process's session, else the default for ``./warehouse``."""
    return _current or log_file({})


def java_options(log4j_config: Path, path: Path) -> str:
    """The driver JVM options that make Spark log to ``path`` with ``log4j_config``."""
    return f'"-Dlog4j2.configurationFile={log4j_config}" "-D{LOG_FILE}={path}"'


def record(error: BaseException) -> Path:
    """Append ``error``'s full traceback to the log file; return the file."""
    path = current()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(f"{datetime.now():%y/%m/%d %H:%M:%S} ERROR autocdc: the command failed\n")
        traceback.print_exception(error, file=out)
    return path


def summary(error: BaseException) -> str:
    """``Class: first line of the message``: an unexpected error, as a terminal shows it
    (the rest of the message is often a query plan, a JVM stack trace or both)."""
    message = str(error)
    if isinstance(error, Py4JJavaError):  # its first line is "An error occurred while calling"
        message = str(error.java_exception)
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
