"""``autocdc report``: a static status page of a pipeline, gathered from its tables.

It reads what the runs left behind, never the definitions: the event log (a Delta table
at ``<storage>/event_log``) says which flows wrote which targets and how each batch went;
each target's quarantine table says what was set aside and why; an SCD type 2 target
(one with ``__END_AT``) gives the versions of a key the user names. A missing table
becomes a note on the page, not an error: the page is most wanted when something is off.
The page itself is rendered by :mod:`autocdc.pipelines.operations.report_html`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from autocdc.engine import END_AT, QUARANTINE_SUFFIX, START_AT, STATE_SUFFIX, ident
from autocdc.pipelines.declare import project as projects
from autocdc.pipelines.errors import PipelineError
from autocdc.pipelines.execute import eventlog
from autocdc.pipelines.operations import overview
from autocdc.pipelines.operations.report_html import (
    Batch,
    FlowStatus,
    Page,
    Quarantine,
    Timeline,
    render,
    require_matplotlib,
)
from autocdc.runtime import AutoCdcError
from autocdc.sources import spark_session

# Enough batches to see a trend without a page of megabytes.
MAX_BATCHES = 500
SAMPLES = 5
BATCH_COLUMNS = (
    "event_time", "batch_id", "rows_in", "upserted", "deleted", "quarantined", "seconds",
    "lag_files", "lag_seconds",
)  # fmt: skip


class ReportKeyError(PipelineError):
    error_class = "AUTOCDC_REPORT_INVALID_KEY"
    template = "--key {value!r} is not COLUMN=VALUE. Write e.g. --key id=5 (one per key column)."


def key_pair(value: str) -> tuple[str, str]:
    """``"id=5"`` -> ``("id", "5")``: the argparse type of ``--key``."""
    column, sep, wanted = value.partition("=")
    if not sep or not column.strip():
        raise argparse.ArgumentTypeError(str(ReportKeyError(value=value)))
    return column.strip(), wanted


def write_report(
    spark: SparkSession,
    project: projects.Project,
    out: Path,
    key: dict[str, str] | None = None,
) -> Path:
    """Write ``out/index.html`` (one self-contained file) and return its path."""
    require_matplotlib()
    events = eventlog.read(spark, project)
    flows = _flows(spark, project, events)
    doc = overview.status(project)  # what `autocdc status` says: staged, retries, last run
    status = {f["flow"]: f for f in doc["flows"]}
    statuses = [_status(spark, events, flow, target, key or {}) for flow, target in flows]
    held = [status.get(s.flow, {}) for s in statuses]
    page = Page(
        pipeline=project.name,
        generated_at=datetime.now().astimezone(),  # Spark's times come back local too
        event_log=str(eventlog.path(project)),
        event_log_found=events is not None,
        key=dict(key or {}),
        flows=[
            replace(s, staged=h.get("staged"), retries=h.get("retries"))
            for s, h in zip(statuses, held, strict=True)
        ],
        last_run=doc["last_run"],
    )
    out.mkdir(parents=True, exist_ok=True)
    index = out / "index.html"
    index.write_text(render(page), encoding="utf-8")
    return index


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``autocdc report``."""
    parser.add_argument("--spec", type=Path, help="spark-pipeline.yml (default: found)")
    parser.add_argument("--out", type=Path, required=True, help="folder for index.html")
    parser.add_argument(
        "--key",
        type=key_pair,
        action="append",
        default=[],
        metavar="COLUMN=VALUE",
        help="an SCD type 2 key to show the versions of; repeat for a composite key",
    )


def main_report(args: argparse.Namespace) -> int:
    """``autocdc report``: load the spec, open its warehouse, write the page."""
    out = args.out.resolve()  # before anything changes the working directory
    try:
        spec = projects.load(args.spec or projects.find_spec(Path.cwd()))
        spark = spark_session(warehouse=spec.warehouse, conf=spec.session_conf)
        index = write_report(spark, spec, out, dict(args.key))
    except AutoCdcError as error:
        print(f"autocdc: {error}", file=sys.stderr)
        return 2
    print(f"autocdc: report written to {index}", flush=True)
    return 0


def _flows(
    spark: SparkSession, project: projects.Project, events: DataFrame | None
) -> list[tuple[str, str]]:
    """(flow, target) pairs: those of the batch events, then CDC targets the log does not
    name (found by their state table), with the flows their quarantine names."""
    found: dict[tuple[str, str], None] = {}
    if events is not None:
        rows = (
            events.where("event_type = 'batch' AND flow IS NOT NULL AND target IS NOT NULL")
            .select("flow", "target")
            .distinct()
            .orderBy("flow", "target")
            .collect()
        )
        found.update({(r.flow, r.target): None for r in rows})
    logged = {target for _, target in found}
    for target in _cdc_targets(spark, project.database):
        if target in logged:
            continue
        names = _quarantine_flows(spark, target) or [target.rpartition(".")[2]]
        found.update({(name, target): None for name in names})
    return list(found)


def _cdc_targets(spark: SparkSession, database: str | None) -> list[str]:
    """Tables with an autocdc state table beside them, qualified like the runner does."""
    if database and not spark.catalog.databaseExists(database):
        return []  # nothing ran yet
    tables = spark.catalog.listTables(database) if database else spark.catalog.listTables()
    names = {t.name for t in tables}
    targets = sorted(n[: -len(STATE_SUFFIX)] for n in names if n.endswith(STATE_SUFFIX))
    return [f"{database}.{t}" if database else t for t in targets]


def _quarantine_flows(spark: SparkSession, target: str) -> list[str]:
    table = target + QUARANTINE_SUFFIX
    if not spark.catalog.tableExists(table):
        return []
    rows = spark.table(table).select("flow").distinct().orderBy("flow").collect()
    return [r.flow for r in rows if r.flow is not None]


def _status(
    spark: SparkSession, events: DataFrame | None, flow: str, target: str, key: dict[str, str]
) -> FlowStatus:
    target_exists = spark.catalog.tableExists(target)
    scd2 = target_exists and END_AT in spark.table(target).columns
    return FlowStatus(
        flow=flow,
        target=target,
        target_exists=target_exists,
        scd2=scd2,
        batches=_batches(events, flow) if events is not None else None,
        last_error=_last_error(events, flow) if events is not None else None,
        quarantine=_quarantine(spark, target, flow),
        timeline=_timeline(spark, target, key) if scd2 and key else None,
    )


def _batches(events: DataFrame, flow: str) -> list[Batch]:
    """The flow's latest batch events, oldest first."""
    latest = Window.orderBy(F.col("event_time").desc(), F.col("batch_id").desc())
    rows = (
        events.where((F.col("event_type") == "batch") & (F.col("flow") == flow))
        .withColumn("_n", F.row_number().over(latest))
        .where(F.col("_n") <= MAX_BATCHES)
        .select(*BATCH_COLUMNS)
        .orderBy("event_time", "batch_id")
        .collect()
    )
    return [Batch(**row.asDict()) for row in rows]


def _last_error(events: DataFrame, flow: str) -> tuple[datetime, str, str] | None:
    row = (
        events.where((F.col("event_type") == "error") & (F.col("flow") == flow))
        .orderBy(F.col("event_time").desc())
        .select("event_time", "error_class", "message")
        .first()
    )
    return None if row is None else (row.event_time, row.error_class or "", row.message or "")


def _quarantine(spark: SparkSession, target: str, flow: str) -> Quarantine | None:
    """Reasons with counts and the newest rows set aside; None without a table."""
    table = target + QUARANTINE_SUFFIX
    if not spark.catalog.tableExists(table):
        return None
    rows = spark.table(table).where(F.col("flow") == flow)
    counts = rows.groupBy("reason").count().orderBy(F.col("count").desc(), "reason").collect()
    samples = (
        rows.orderBy(F.col("quarantined_at").desc(), "batch_id")
        .select("quarantined_at", "batch_id", "reason", "sequence", "row")
        .limit(SAMPLES)
        .collect()
    )
    return Quarantine(
        table=table,
        reasons=[(r.reason, r["count"]) for r in counts],
        samples=[r.asDict() for r in samples],
    )


def _timeline(spark: SparkSession, target: str, key: dict[str, str]) -> Timeline:
    """The versions of one key, oldest first, as text (the sequence may be any type)."""
    columns = spark.table(target).columns
    missing = [c for c in key if c not in columns]
    values = [c for c in columns if c not in (START_AT, END_AT) and c not in key]
    if missing:
        return Timeline(key=key, columns=values, versions=[], missing=missing)
    match = F.lit(True)
    for column, wanted in key.items():
        # As text: the key may be any type, and a string literal against an int column
        # fails under ANSI casts when it is not a number.
        match = match & (F.col(ident(column)).cast("string") == F.lit(wanted))
    rows = (
        spark.table(target)
        .where(match)
        .orderBy(F.col(ident(START_AT)))
        .select(
            F.col(ident(START_AT)).cast("string").alias("start"),
            F.col(ident(END_AT)).cast("string").alias("end"),
            *[F.col(ident(c)).cast("string").alias(f"v{i}") for i, c in enumerate(values)],
        )
        .collect()
    )
    versions = [(r.start, r.end, [r[f"v{i}"] for i in range(len(values))]) for r in rows]
    return Timeline(key=key, columns=values, versions=versions, missing=[])
