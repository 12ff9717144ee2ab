"""A class-data-sharing archive of the classes a session loads, made once per virtualenv.

A JVM that starts a session and applies its first batches loads some 20,000 classes from
~300 jars, parsing and verifying each. Mapped from an archive instead, they take
seconds off every start: every ``autocdc run``, every job.

The archive is ``<venv>/share/autocdc/jars/autocdc-classes.jsa``, made by
:mod:`autocdc.runtime.dump` (``make setup``, after the jars). Sessions autocdc starts map
it (``-XX:SharedArchiveFile``). A JVM that finds it does not match (another Java, other
jars) says so in the log and loads its classes as usual; a marker file names the pyspark
and Delta versions it was made for, so an upgrade makes it again.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

from autocdc.runtime import jars

ARCHIVE = "autocdc-classes.jsa"
MARKER = "autocdc-classes.json"


def path() -> Path:
    return jars.jar_dir() / ARCHIVE


def read_marker() -> dict | None:
    """What the last making was for, and whether it wrote an archive."""
    try:
        marker = json.loads((jars.jar_dir() / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def marker_for(written: bool) -> dict:
    """The marker of a making for today's pyspark and jars that wrote an archive, or not."""
    return {"pyspark": version("pyspark"), "jars": jars.coordinates(), "archive": written}


def usable() -> Path | None:
    """The archive, if it was made for today's pyspark and the session's jars."""
    return path() if read_marker() == marker_for(True) and path().is_file() else None


def java_option() -> str | None:
    """The driver JVM option that maps the archive (None: there is none to map)."""
    found = usable()
    return f'"-XX:SharedArchiveFile={found}"' if found is not None else None
