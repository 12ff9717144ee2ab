"""The event log: one Delta table per pipeline, at ``<storage>/event_log``, a row per event.

Every event is its own append, committed before the run goes on, so a run killed at any
moment leaves every event written before the kill (a Delta commit is all or nothing). The
schema is a contract shared with the report and with scripts: columns are only ever added.

Events are appended with delta-rs (the ``deltalake`` package), not Spark: a one-row
append through Spark is a job and a snapshot update (most of a second) and takes
milliseconds this way, and a run writes several a flow. Only ``autocdc run`` writes the
log, one run at a time (:mod:`autocdc.pipelines.execute.lock`); Spark reads it like any
Delta table.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from autocdc.engine import BatchMetrics
from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.execute.position import Lag
from autocdc.pipelines.execute.progress import staging

EVENT_TYPES = (
    "run_started",
    "run_finished",
    "run_failed",
    "run_stopped",  # the user stopped the run (Ctrl-C): not a failure
    "flow_started",
    "flow_stopped",
    "batch",
    "error",
    "checkpoint_moved",  # the project moved: its checkpoints' file paths were translated
    "replay",  # a flow rewound to a position of its source (execute/replay.py)
    "flow_retry",  # a flow failed on an error not autocdc's own: it starts again (retries.py)
    "checkpoint_restarted",  # a query killed before its first batch logged: started afresh
)
MESSAGE_LIMIT = 20_000  # a streaming failure carries a whole Python traceback

SCHEMA = StructType(
    [
        StructField("run_id", StringType()),
        StructField("pipeline", StringType()),
        StructField("event_time", TimestampType()),
        StructField("event_type", StringType()),
        StructField("flow", StringType()),
        StructField("target", StringType()),
        StructField("batch_id", LongType()),
        StructField("stream_batch_id", LongType()),
        StructField("rows_in", LongType()),
        StructField("upserted", LongType()),
        StructField("deleted", LongType()),
        StructField("quarantined", LongType()),
        StructField("seconds", DoubleType()),
        StructField("metrics", StringType()),
        StructField("source_position", StringType()),
        StructField("lag_files", LongType()),
        StructField("lag_bytes", LongType()),
        StructField("lag_seconds", DoubleType()),
        StructField("error_class", StringType()),
        StructField("message", StringType()),
        StructField("host", StringType()),
        StructField("pid", IntegerType()),
        # Added later (columns are only added; older logs gain them at their next write):
        # a max_staleness flow's rows a micro-batch staged, and staged rows an apply took.
        StructField("staged", LongType()),
        StructField("applied_staged", LongType()),
    ]
)


# SCHEMA as delta-rs writes it (Spark's timestamps are UTC instants in microseconds).
_ARROW_TYPES = {
    StringType(): pa.string(),
    TimestampType(): pa.timestamp("us", tz="UTC"),
    LongType(): pa.int64(),
    DoubleType(): pa.float64(),
    IntegerType(): pa.int32(),
}
ARROW_SCHEMA = pa.schema([pa.field(f.name, _ARROW_TYPES[f.dataType]) for f in SCHEMA.fields])


def path(project: Project) -> Path:
    return project.storage_path / "event_log"


def error_class(error: BaseException) -> str:
    """``AutoCdcError.error_class``, else the exception's class name."""
    return getattr(error, "error_class", None) or type(error).__name__


def read(spark: SparkSession, project: Project) -> DataFrame | None:
    """The pipeline's events, or None before its first run."""
    location = path(project)
    if not (location / "_delta_log").is_dir():
        return None
    return spark.read.format("delta").load(str(location))


@dataclass
class EventLog:
    """The writer of one run's events (``run_id`` is new for every ``autocdc run``)."""

    location: Path
    pipeline: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def of(cls, project: Project) -> EventLog:
        return cls(path(project), project.name)

    def write(
        self,
        event_type: str,
        *,
        flow: str | None = None,
        target: str | None = None,
        metrics: BatchMetrics | None = None,
        stream_batch_id: int | None = None,
        position: list[dict[str, Any]] | None = None,
        lag: Lag | None = None,
        error: BaseException | None = None,
        message: str | None = None,
    ) -> None:
        """Append one event, committed when this returns."""
        values = self.row(event_type, flow, target, metrics, stream_batch_id, position, lag, error)
        if message is not None:
            values["message"] = message
        frame = pa.Table.from_pylist([values], schema=ARROW_SCHEMA)
        # "merge": a log an older autocdc wrote gains the columns added since.
        write_deltalake(str(self.location), frame, mode="append", schema_mode="merge")

    def row(
        self,
        event_type: str,
        flow: str | None,
        target: str | None,
        metrics: BatchMetrics | None,
        stream_batch_id: int | None,
        position: list[dict[str, Any]] | None,
        lag: Lag | None,
        error: BaseException | None,
    ) -> dict[str, Any]:
        """The event's column values (no Spark involved)."""
        assert event_type in EVENT_TYPES, event_type
        counts = metrics.as_dict() if metrics is not None else {}
        return {
            "run_id": self.run_id,
            "pipeline": self.pipeline,
            "event_time": datetime.now(timezone.utc),
            "event_type": event_type,
            "flow": flow,
            "target": target,
            "batch_id": counts.get("batch_id"),
            "stream_batch_id": stream_batch_id,
            "rows_in": counts.get("rows_in"),
            "upserted": counts.get("upserted"),
            "deleted": counts.get("deleted"),
            "quarantined": counts.get("quarantined"),
            "seconds": float(counts["seconds"]) if counts else None,
            "metrics": json.dumps(counts, sort_keys=True) if counts else None,
            "source_position": json.dumps(position) if position is not None else None,
            "lag_files": lag.files if lag else None,
            "lag_bytes": lag.bytes if lag else None,
            "lag_seconds": lag.oldest_age_seconds if lag else None,
            "error_class": error_class(error) if error is not None else None,
            "message": str(error)[:MESSAGE_LIMIT] if error is not None else None,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "staged": counts.get("rows_staged") if counts.get("stage_id") is not None else None,
            "applied_staged": counts.get("applied_staged") if staging(counts) else None,
        }
