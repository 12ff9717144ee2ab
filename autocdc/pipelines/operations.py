"""``autocdc status`` and ``autocdc history``: what the runs did and how far behind each
flow is, as JSON-ready dicts (keys documented in the README, stable for scripts) and as
compact tables for people.

Everything comes from the event log except what must be current: the lag is computed
now, from each flow's checkpoint and its sources, and the row counts from the tables.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timedelta, timezone
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from rich.console import Console
from rich.table import Table

from autocdc.engine.tables import QUARANTINE_SUFFIX, STATE_SUFFIX
from autocdc.pipelines import eventlog
from autocdc.pipelines import position as pos
from autocdc.pipelines.errors import UnknownFlowError
from autocdc.pipelines.progress import describe_lag
from autocdc.pipelines.project import Project

RUN_EVENTS = ("run_started", "run_finished", "run_failed")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _iso(micros: int | None) -> str | None:
    """UTC ISO 8601 (``2026-11-30T16:11:50.123456Z``): independent of the session's zone."""
    if micros is None:
        return None
    return (EPOCH + timedelta(microseconds=micros)).isoformat().replace("+00:00", "Z")


def _events(spark: SparkSession, project: Project) -> DataFrame | None:
    events = eventlog.read(spark, project)
    if events is None:
        return None
    micros = F.unix_micros("event_time").alias("t")
    return events.where(F.col("pipeline") == project.name).select("*", micros)


def _alive(host: str | None, pid: int | None) -> bool:
    if host != socket.gethostname() or pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _runs(events: DataFrame) -> dict[str, dict[str, Any]]:
    """Each run's id, status (finished, failed, running, or interrupted: no end event and
    its process is gone), start and end, and its error."""
    runs: dict[str, dict[str, Any]] = {}
    rows = events.where(F.col("event_type").isin(*RUN_EVENTS)).orderBy("t").collect()
    for row in rows:
        run = runs.setdefault(row.run_id, {"run_id": row.run_id, "status": "running"})
        if row.event_type == "run_started":
            run.update(started=_iso(row.t), ended=None, error_class=None, message=None)
            run["status"] = "running" if _alive(row.host, row.pid) else "interrupted"
        else:
            run["status"] = "finished" if row.event_type == "run_finished" else "failed"
            run.update(ended=_iso(row.t), error_class=row.error_class, message=row.message)
    return runs


def _last(value: str | Column, when: Column) -> Column:
    """The value of the latest event where ``when`` holds (max_by skips NULL orderings)."""
    return F.max_by(value, F.when(when, F.col("t")))


def _target_counts(spark: SparkSession, flow: str, target: str) -> dict[str, Any]:
    """SCD type, live rows (SCD2: open versions) and quarantined rows by reason."""
    counts: dict[str, Any] = {"scd_type": None, "live_rows": None, "quarantined": None}
    if spark.catalog.tableExists(target):
        table = spark.read.table(target)
        scd2 = "__END_AT" in table.columns
        counts["live_rows"] = (table.where(F.col("__END_AT").isNull()) if scd2 else table).count()
        if spark.catalog.tableExists(target + STATE_SUFFIX):
            counts["scd_type"] = 2 if scd2 else 1
    quarantine = target + QUARANTINE_SUFFIX
    if spark.catalog.tableExists(quarantine):
        rows = spark.read.table(quarantine).where(F.col("flow") == flow).groupBy("reason").count()
        by_reason = {r.reason: r["count"] for r in rows.collect()}
        counts["quarantined"] = {"total": sum(by_reason.values()), "by_reason": by_reason}
    elif counts["scd_type"] is not None:
        counts["quarantined"] = {"total": 0, "by_reason": {}}
    return counts


def status(spark: SparkSession, project: Project) -> dict[str, Any]:
    """Per flow: its last batch, totals, live and quarantined rows, tombstones, lag now."""
    doc: dict[str, Any] = {
        "pipeline": project.name,
        "event_log": str(eventlog.path(project)),
        "last_run": None,
        "flows": [],
    }
    events = _events(spark, project)
    if events is None:
        return doc
    runs = _runs(events)
    doc["last_run"] = list(runs.values())[-1] if runs else None
    is_batch = F.col("event_type") == "batch"
    batch = F.struct("batch_id", "stream_batch_id", "t", "upserted", "deleted", "metrics")
    flows = (
        events.where(F.col("flow").isNotNull())
        .groupBy("flow")
        .agg(
            F.max_by("target", "t").alias("target"),
            F.max_by("run_id", "t").alias("run_id"),
            _last(batch, is_batch).alias("batch"),
            F.sum(F.when(is_batch, F.col("upserted") + F.col("deleted"))).alias("applied"),
            _last("source_position", F.col("source_position").isNotNull()).alias("position"),
        )
        .orderBy("flow")
        .collect()
    )
    for row in flows:
        last = row.batch
        found = json.loads(row.position) if row.position else []
        lag = pos.lag_now(found, project.checkpoint(row.flow)) if found else pos.Lag()
        tombstones = json.loads(last.metrics)["tombstones_live"] if last else None
        entry = {
            "flow": row.flow,
            "target": row.target,
            **_target_counts(spark, row.flow, row.target),
            "last_batch": None
            if last is None
            else {
                "batch_id": last.batch_id,
                "stream_batch_id": last.stream_batch_id,
                "time": _iso(last.t),
                "rows_applied": last.upserted + last.deleted,
            },
            "rows_applied_total": row.applied or 0,
            "tombstones_live": tombstones,
            "lag": lag.as_dict(),
            "last_run": runs.get(row.run_id),
        }
        doc["flows"].append(entry)
    return doc


def history(spark: SparkSession, project: Project, flow: str, last: int) -> dict[str, Any]:
    """The last ``last`` batch events of ``flow``, oldest first."""
    events = _events(spark, project)
    batches = (
        events.where((F.col("event_type") == "batch") & (F.col("flow") == flow))
        if events is not None
        else None
    )
    rows = batches.orderBy(F.col("t").desc()).limit(last).collect() if batches else []
    if not rows:
        known = []
        if events is not None:
            named = events.where(F.col("event_type") == "batch").select("flow").distinct()
            known = sorted(r.flow for r in named.collect())
        raise UnknownFlowError(pipeline=project.name, flow=flow, known=known or "none")
    return {
        "pipeline": project.name,
        "flow": flow,
        "batches": [
            {
                "run_id": r.run_id,
                "time": _iso(r.t),
                "batch_id": r.batch_id,
                "stream_batch_id": r.stream_batch_id,
                "rows_in": r.rows_in,
                "upserted": r.upserted,
                "deleted": r.deleted,
                "quarantined": r.quarantined,
                "seconds": r.seconds,
                "metrics": json.loads(r.metrics),
                "source_position": json.loads(r.source_position) if r.source_position else None,
                "lag": {"files": r.lag_files, "bytes": r.lag_bytes, "seconds": r.lag_seconds},
            }
            for r in reversed(rows)
        ],
    }


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _when(iso: str | None) -> str:
    """``2026-11-30 16:31:29`` (UTC, to the second) for people."""
    return "-" if iso is None else iso[:19].replace("T", " ")


def show_status(doc: dict[str, Any], console: Console) -> None:
    run = doc["last_run"]
    if run is None:
        console.print(f"pipeline {doc['pipeline']}: no run yet (event log {doc['event_log']})")
        return
    failed = f": {run['error_class']}" if run.get("error_class") else ""
    console.print(
        f"pipeline {doc['pipeline']}: last run {run['run_id']} {run['status']}{failed} "
        f"(started {_when(run['started'])} UTC, ended {_when(run['ended'])})"
    )
    table = Table("flow", "target", "scd", "batch", "at (UTC)", "applied", "total", box=None)
    for name in ("live", "quarantined", "tombstones", "lag"):
        table.add_column(name)
    reasons = []
    for f in doc["flows"]:
        last = f["last_batch"] or {}
        quarantined = f["quarantined"]
        table.add_row(
            f["flow"],
            f["target"],
            _dash(f["scd_type"]),
            _dash(last.get("batch_id")),
            _when(last.get("time")),
            _dash(last.get("rows_applied")),
            str(f["rows_applied_total"]),
            _dash(f["live_rows"]),
            _dash(quarantined and quarantined["total"]),
            _dash(f["tombstones_live"]),
            describe_lag(pos.Lag(**f["lag"])),
        )
        if quarantined and quarantined["total"]:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(quarantined["by_reason"].items()))
            table_name = f["target"] + QUARANTINE_SUFFIX
            reasons.append(f"quarantined by {f['flow']} (in {table_name}): {counts}")
    console.print(table)
    for line in reasons:
        console.print(line)


def show_history(doc: dict[str, Any], console: Console) -> None:
    console.print(f"flow {doc['flow']} of pipeline {doc['pipeline']}")
    table = Table("batch", "stream", "at (UTC)", "rows in", "upserted", "deleted", box=None)
    for name in ("quarantined", "stale", "seconds", "lag files", "run"):
        table.add_column(name)
    for b in doc["batches"]:
        table.add_row(
            str(b["batch_id"]),
            _dash(b["stream_batch_id"]),
            _when(b["time"]),
            str(b["rows_in"]),
            str(b["upserted"]),
            str(b["deleted"]),
            str(b["quarantined"]),
            str(b["metrics"]["ignored_stale"]),
            f"{b['seconds']:.1f}",
            _dash(b["lag"]["files"]),
            b["run_id"][:8],
        )
    console.print(table)
