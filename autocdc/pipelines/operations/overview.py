"""``autocdc status`` and ``autocdc history``: what the runs did and how far behind each
flow is, as JSON-ready dicts (keys documented in docs/operations.md, stable for scripts) and as
compact tables for people.

Everything comes from the event log except what must be current: the lag is computed
now, from each flow's checkpoint and its sources, and the row counts from the tables.
No Spark: the tables are read with delta-rs (:mod:`autocdc.pipelines.operations.lake`), so either
command answers in about a second.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from autocdc.engine import QUARANTINE_SUFFIX, STATE_SUFFIX
from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.errors import UnknownFlowError
from autocdc.pipelines.execute import eventlog
from autocdc.pipelines.execute import position as pos
from autocdc.pipelines.execute.checkpoint import CheckpointFile
from autocdc.pipelines.execute.progress import describe_lag, is_staged_apply, rows_staged
from autocdc.pipelines.operations import lake
from autocdc.sources import extract

RUN_EVENTS = ("run_started", "run_finished", "run_failed", "run_stopped")
# A run's status by its end event (no end event: running, or interrupted when killed).
ENDED = {"run_finished": "finished", "run_failed": "failed", "run_stopped": "stopped"}
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
BATCH_FIELDS = ("batch_id", "stream_batch_id", "event_time", "upserted", "deleted", "metrics")


def _iso(micros: int | None) -> str | None:
    """UTC ISO 8601 (``2026-11-30T16:11:50.123456Z``): independent of the session's zone."""
    if micros is None:
        return None
    return (EPOCH + timedelta(microseconds=micros)).isoformat().replace("+00:00", "Z")


def _events(project: Project, sql: str) -> list[dict[str, Any]] | None:
    """Rows of ``sql`` over this pipeline's events (``events``), None before its first
    run; ``event_time`` comes back as microseconds in ``t``."""
    log = eventlog.path(project)
    if not lake.exists(log):
        return None
    mine = f"SELECT * FROM log WHERE pipeline = {lake.literal(project.name)}"
    rows = lake.query(f"WITH events AS ({mine}) {sql}", log=log)
    for row in rows:
        if "event_time" in row:
            row["t"] = lake.micros(row.pop("event_time"))
    return rows


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


def _runs(project: Project) -> dict[str, dict[str, Any]]:
    """Each run's id, status (finished, failed, stopped: by the user, with Ctrl-C;
    running, or interrupted: no end event and its process is gone), start and end, and
    its error (a stopped run's message says who stopped it)."""
    runs: dict[str, dict[str, Any]] = {}
    kinds = ", ".join(lake.literal(k) for k in RUN_EVENTS)
    rows = _events(
        project,
        "SELECT run_id, event_type, event_time, error_class, message, host, pid "
        f"FROM events WHERE event_type IN ({kinds}) ORDER BY event_time",
    )
    for row in rows or []:
        run = runs.setdefault(row["run_id"], {"run_id": row["run_id"], "status": "running"})
        if row["event_type"] == "run_started":
            run.update(started=_iso(row["t"]), ended=None, error_class=None, message=None)
            run["status"] = "running" if _alive(row["host"], row["pid"]) else "interrupted"
        else:
            run["status"] = ENDED[row["event_type"]]
            run.update(ended=_iso(row["t"]), error_class=row["error_class"], message=row["message"])
    return runs


def _last(name: str, when: str = "TRUE") -> str:
    """The value of the latest event where ``when`` holds."""
    return f"last_value({name} ORDER BY event_time) FILTER (WHERE {when}) AS {name}"


def target_counts(warehouse: Path, flow: str, target: str) -> dict[str, Any]:
    """SCD type, live rows (SCD2: open versions) and quarantined rows by reason of a
    flow's target in ``warehouse``."""
    counts: dict[str, Any] = {"scd_type": None, "live_rows": None, "quarantined": None}
    table = lake.location(warehouse, target)
    if lake.exists(table):
        scd2 = "__END_AT" in lake.columns(table)
        where = f"WHERE {lake.column('__END_AT')} IS NULL" if scd2 else ""
        (row,) = lake.query(f"SELECT count(*) AS n FROM t {where}", t=table)
        counts["live_rows"] = row["n"]
        if lake.exists(lake.location(warehouse, target + STATE_SUFFIX)):
            counts["scd_type"] = 2 if scd2 else 1
    quarantine = lake.location(warehouse, target + QUARANTINE_SUFFIX)
    if lake.exists(quarantine):
        mine = f"flow = {lake.literal(flow)}"
        rows = lake.query(
            f"SELECT reason, count(*) AS n FROM q WHERE {mine} GROUP BY reason", q=quarantine
        )
        by_reason = {r["reason"]: r["n"] for r in rows}
        counts["quarantined"] = {"total": sum(by_reason.values()), "by_reason": by_reason}
    elif counts["scd_type"] is not None:
        counts["quarantined"] = {"total": 0, "by_reason": {}}
    return counts


def extraction_lag(checkpoint: Path) -> dict[str, Any] | None:
    """An extraction flow's lag: when its last successful run ended and how long ago, its
    checkpoint, the newest values its source held when that run began, and how far behind
    them the checkpoint is, per ``cdc_order`` column, or why that run could not look the
    newest values up (None: not an extraction flow, or no run has succeeded). From the
    flow's files alone: ``status`` queries no database."""
    ran = CheckpointFile(checkpoint).last_run()
    if ran is None:
        return None
    ended = datetime.fromisoformat(ran["ended"])
    since = (datetime.now(timezone.utc) - ended).total_seconds()
    return {**json.loads(extract.dumps(ran)), "seconds_since": round(since, 3)}


def describe_extraction(lag: dict[str, Any]) -> str:
    """``last run 40 s ago; updated_at 15 s behind``, or ``...; lag unknown`` when that
    run could not look up the newest values."""
    said = f"last run {lag['seconds_since']:,.0f} s ago"
    if lag.get("lag_unknown"):
        return f"{said}; lag unknown"
    gaps = [f"{column} {gap:,.6g} behind" for column, gap in lag["behind"].items() if gap]
    return "; ".join([said, *gaps])


def staged(metrics: dict[str, Any], micros: int | None) -> dict[str, Any] | None:
    """A flow with ``max_staleness``: what it held staged after its last batch (the
    batch's event at ``micros``), and how old its oldest staged change is now; None for
    other flows."""
    if metrics.get("stage_id") is None and not metrics.get("applied_staged"):
        return None
    age, oldest = metrics.get("oldest_staged_seconds"), None
    if age is not None and micros is not None:
        oldest = micros - int(age * 1e6)
        age = round((datetime.now(timezone.utc) - EPOCH).total_seconds() - oldest / 1e6, 3)
    return {
        "batches": metrics.get("staged_batches", 0),
        "rows": metrics.get("staged_rows", 0),
        "oldest_staged_at": _iso(oldest),
        "oldest_age_seconds": age,
        "last_apply_rows": metrics.get("applied_staged", 0),
    }


def status(project: Project) -> dict[str, Any]:
    """Per flow: its last batch, totals, live and quarantined rows, tombstones, lag now."""
    doc: dict[str, Any] = {
        "pipeline": project.name,
        "event_log": str(eventlog.path(project)),
        "last_run": None,
        "flows": [],
    }
    if not lake.exists(eventlog.path(project)):
        return doc
    runs = _runs(project)
    doc["last_run"] = list(runs.values())[-1] if runs else None
    is_batch = "event_type = 'batch'"
    last_batch = ", ".join(_last(f, is_batch) for f in BATCH_FIELDS)
    flows = _events(
        project,
        f"SELECT flow, {_last('target')}, {_last('run_id')}, {last_batch}, "
        f"sum(upserted + deleted) FILTER (WHERE {is_batch}) AS applied, "
        f"{_last('source_position', 'source_position IS NOT NULL')} "
        "FROM events WHERE flow IS NOT NULL GROUP BY flow ORDER BY flow",
    )
    retried = {
        (r["flow"], r["run_id"]): r
        for r in _events(
            project,
            "SELECT flow, run_id, count(*) AS n, "
            f"{_last('error_class')}, {_last('message')}, max(event_time) AS event_time "
            "FROM events WHERE event_type = 'flow_retry' GROUP BY flow, run_id",
        )
        or []
    }
    for row in flows or []:
        found = json.loads(row["source_position"]) if row["source_position"] else []
        lag = (
            pos.lag_now(found, project.checkpoint(row["flow"]), project.root)
            if found
            else pos.Lag()
        )
        batched = row["batch_id"] is not None
        # A batch event written without metrics (by a script: the log is a contract) has none.
        metrics = json.loads(row["metrics"]) if batched and row["metrics"] else {}
        tombstones = metrics.get("tombstones_live")
        fell_back = {
            table: why
            for source in found
            for table, why in ((source.get("offset") or {}).get("watermarked") or {}).items()
        }
        entry = {
            "flow": row["flow"],
            "target": row["target"],
            **target_counts(project.warehouse, row["flow"], row["target"]),
            "last_batch": {
                "batch_id": row["batch_id"],
                "stream_batch_id": row["stream_batch_id"],
                "time": _iso(row["t"]),
                "rows_applied": (row["upserted"] or 0) + (row["deleted"] or 0),
            }
            if batched
            else None,
            "rows_applied_total": row["applied"] or 0,
            "tombstones_live": tombstones,
            "lag": lag.as_dict(),
            "extraction": extraction_lag(project.checkpoint(row["flow"])),
            "last_run": runs.get(row["run_id"]),
            # Tables whose initial load went by watermarks (docs/sources.md), and why.
            "load_by_watermarks": fell_back,
            "staged": staged(metrics, row["t"]),
            "retries": _retries(retried.get((row["flow"], row["run_id"]))),
        }
        doc["flows"].append(entry)
    return doc


def _retries(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """How often a flow was started again after a failure in its last run, and the last
    failure's class, message and time; None: never."""
    if row is None:
        return None
    return {
        "count": row["n"],
        "last_error_class": row["error_class"],
        "last_message": row["message"],
        "last_time": _iso(row["t"]),
    }


def history(project: Project, flow: str, last: int) -> dict[str, Any]:
    """The last ``last`` batch events of ``flow`` (or of the one flow into target
    ``flow``, qualified or not), oldest first."""
    name = lake.literal(flow)
    rows = _events(
        project,
        f"SELECT * FROM events WHERE event_type = 'batch' AND flow = {name} "
        f"ORDER BY event_time DESC LIMIT {int(last)}",
    )
    if not rows:
        pairs = _events(
            project, "SELECT DISTINCT flow, target FROM events WHERE event_type = 'batch'"
        )
        into = {r["flow"] for r in pairs or [] if flow in (r["target"], r["target"].split(".")[-1])}
        if len(into) == 1:
            return history(project, into.pop(), last)
        known = sorted({r["flow"] for r in pairs or []})
        raise UnknownFlowError(pipeline=project.name, flow=flow, known=known or "none")
    return {
        "pipeline": project.name,
        "flow": flow,
        "batches": [_batch(r) for r in reversed(rows)],
    }


def _batch(r: dict[str, Any]) -> dict[str, Any]:
    """One batch event as ``history --json`` lists it."""
    metrics = json.loads(r["metrics"])
    return {
        "run_id": r["run_id"],
        "time": _iso(r["t"]),
        "batch_id": r["batch_id"],
        "stream_batch_id": r["stream_batch_id"],
        "rows_in": r["rows_in"],
        "upserted": r["upserted"],
        "deleted": r["deleted"],
        "quarantined": r["quarantined"],
        "seconds": r["seconds"],
        "metrics": metrics,
        # A max_staleness flow's: rows the micro-batch staged, staged rows applied.
        "staged": rows_staged(metrics),
        "applied_staged": metrics.get("applied_staged", 0),
        "source_position": json.loads(r["source_position"]) if r["source_position"] else None,
        "lag": {"files": r["lag_files"], "bytes": r["lag_bytes"], "seconds": r["lag_seconds"]},
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
    if run["status"] == "stopped":
        failed = f" ({run['message']})" if run.get("message") else ""
    console.print(
        f"pipeline {doc['pipeline']}: last run {run['run_id']} {run['status']}{failed} "
        f"(started {_when(run['started'])} UTC, ended {_when(run['ended'])})"
    )
    table = Table("flow", "target", "scd", "micro-batch", "at (UTC)", "applied", "total", box=None)
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
            _dash(_number(last)),
            _when(last.get("time")),
            _dash(last.get("rows_applied")),
            str(f["rows_applied_total"]),
            _dash(f["live_rows"]),
            _dash(quarantined and quarantined["total"]),
            _dash(f["tombstones_live"]),
            describe_extraction(f["extraction"])
            if f["extraction"]
            else describe_lag(pos.Lag(**f["lag"])),
        )
        if f.get("staged") and f["staged"]["rows"]:
            held = f["staged"]
            age = held["oldest_age_seconds"]
            reasons.append(
                f"{f['flow']}: {held['rows']} changes staged in {held['batches']} micro-batches"
                + ("" if age is None else f", the oldest {age:,.0f} s old")
                + " (applied within max_staleness; `autocdc apply` applies them now)"
            )
        if f.get("retries"):
            again = f["retries"]
            said = (again["last_message"] or "").splitlines()[0][:200]
            reasons.append(
                f"{f['flow']}: started again {again['count']} times in its last run after "
                f"failures, the last at {_when(again['last_time'])} UTC ({said})"
            )
        for source_table, why in f["load_by_watermarks"].items():
            reasons.append(
                f"{f['flow']}: the initial load of {source_table} went by watermarks ({why}): "
                "its rows' SCD type 2 history starts where they were read, not where capture "
                "began (docs/sources.md#postgresql-log-based)"
            )
        if quarantined and quarantined["total"]:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(quarantined["by_reason"].items()))
            table_name = f["target"] + QUARANTINE_SUFFIX
            reasons.append(f"quarantined by {f['flow']} (in {table_name}): {counts}")
    console.print(table)
    for line in reasons:
        console.print(line)


def _number(batch: dict[str, Any]) -> int | None:
    """A micro-batch as people see it: its streaming query's number (from 0, over all
    runs); a batch source's one batch has none, and shows its commit."""
    return (
        batch.get("batch_id") if batch.get("stream_batch_id") is None else batch["stream_batch_id"]
    )


def show_history(doc: dict[str, Any], console: Console) -> None:
    """Micro-batches by their query's number; ``commit`` is the engine's id of the target
    state the batch left (a batch that changed nothing commits nothing: the same id). A
    ``max_staleness`` flow's rows wait staged (``staged``: the rows a micro-batch staged)
    until an apply, its own row (``apply``), applies them."""
    console.print(f"flow {doc['flow']} of pipeline {doc['pipeline']}")
    table = Table("micro-batch", "commit", "at (UTC)", "rows in", "upserted", "deleted", box=None)
    for name in ("staged", "quarantined", "stale", "seconds", "lag files", "run"):
        table.add_column(name)
    for b in doc["batches"]:
        apply = is_staged_apply(b["metrics"])
        table.add_row(
            "apply" if apply else _dash(_number(b)),
            str(b["batch_id"]),
            _when(b["time"]),
            str(b["rows_in"]),
            str(b["upserted"]),
            str(b["deleted"]),
            _dash(b.get("staged")),
            str(b["quarantined"]),
            str(b["metrics"]["ignored_stale"]),
            f"{b['seconds']:.1f}",
            _dash(b["lag"]["files"]),
            b["run_id"][:8],
        )
    console.print(table)
