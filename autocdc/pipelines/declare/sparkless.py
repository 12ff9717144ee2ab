"""A project's declarations read without Spark, for what the CLI can refuse before a JVM
starts (about 20 s): a ``--replay-from`` that names no flow, or a flow whose source has no
positions.

Library files get a stand-in ``spark`` that records a plain streaming read
(``spark.readStream.schema(...).json("data/changes")``, ``.format("delta").load(...)``,
``.table(...)``) and raises :class:`SparkNeeded` at anything else. Where the stand-in is
not enough (a file that uses the session as it loads, a view that transforms what it
reads), the answer is "unknown": the checks run again, complete, once Spark is there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocdc.pipelines.declare import registry
from autocdc.pipelines.declare.project import Project

FILE_FORMATS = {"json", "csv", "parquet", "orc", "text", "avro", "xml", "binaryfile"}


class SparkNeeded(Exception):
    """The definitions used the session beyond what the stand-in records."""


@dataclass(frozen=True)
class Read:
    """A streaming read, as declared: its format (``None``: a table, by ``table``)."""

    format: str | None
    table: str | None = None

    @property
    def kind(self) -> str:
        """As :func:`autocdc.pipelines.execute.position.sources` names it."""
        if self.format is None or "delta" in self.format:
            return "delta"
        if self.format in FILE_FORMATS:
            return "files"
        return "kafka" if self.format == "kafka" else "other"


class _Reader:
    """``spark.readStream``: options and a schema are taken, a read is recorded."""

    def __init__(self) -> None:
        self._format: str | None = None

    def format(self, source: str) -> _Reader:
        self._format = source.lower()
        return self

    def schema(self, *_: Any, **__: Any) -> _Reader:
        return self

    option = options = schema

    def load(self, *_: Any, **__: Any) -> Read:
        return Read(self._format or "parquet")  # Spark's default source

    def table(self, name: str) -> Read:
        return Read(None, name)

    def __getattr__(self, name: str) -> Any:
        if name in FILE_FORMATS:
            return lambda *_, **__: Read(name)
        raise SparkNeeded(f"spark.readStream.{name}")


class StandIn:
    """The ``spark`` global of library files read without Spark."""

    @property
    def readStream(self) -> _Reader:  # pyspark's name
        return _Reader()

    def __getattr__(self, name: str) -> Any:
        raise SparkNeeded(f"spark.{name}")


@contextlib.contextmanager
def _in(folder: Path) -> Iterator[None]:
    cwd = Path.cwd()
    os.chdir(folder)  # relative paths and `file:line` as a run has them
    try:
        yield
    finally:
        os.chdir(cwd)


def load(project: Project) -> registry.Registry | None:
    """The project's declarations, or None when they cannot be read without Spark (or fail
    to load: a run reports that, with the session it needs)."""
    try:
        with _in(project.root):
            return registry.load(project, StandIn())  # type: ignore[arg-type]
    except Exception:
        return None


def streaming_read(declared: registry.Registry, dataset: str) -> Read | None:
    """What the temporary view ``dataset`` reads, when its query is one plain streaming
    read (None: not known without Spark)."""
    flows = [f for f in declared.flows.values() if f.target == dataset]
    view = declared.datasets.get(dataset)
    if view is None or view.kind != "temporary_view" or len(flows) != 1:
        return None
    flow = flows[0]
    if not isinstance(flow, registry.QueryFlow) or getattr(flow.query, "func", None):
        return None  # a partial: a Debezium source, which builds its own reads
    try:
        read = flow.query()
    except Exception:
        return None
    return read if isinstance(read, Read) else None
