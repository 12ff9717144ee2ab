"""The staging table of flows with ``max_staleness``: changes received, not applied yet.

A micro-batch of such a flow is validated (bad rows quarantined as always) and its
changes appended here, ``<target>__autocdc_staged``, one Delta commit per micro-batch
with Delta's idempotent-write pair ``(autocdc/<target>/staged/<flow>, stage id)``: a
replayed stage id is skipped by Delta itself, and a crash before the commit stages
nothing. The rows are the batch's own columns, already fitted to the target's types,
plus who staged them, when, and under which stage id.

Applying is the engine's ordinary batch over every staged row of the flow (the result
depends only on the set of changes, so many micro-batches applied as one give the same
target), then the applied rows are deleted by stage id. A crash between the two applies
them again next time, which the engine absorbs as a replay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from autocdc.engine import commit, tables
from autocdc.engine.fit import nullable
from autocdc.engine.tables import CONFLICTS, col

STAGED_SUFFIX = "__autocdc_staged"
FLOW = "__autocdc_flow"
STAGE = "__autocdc_stage"
STAGED_AT = "__autocdc_staged_at"
COLUMNS = (FLOW, STAGE, STAGED_AT)
# Column mapping lets any user column name in; type widening follows the target's.
_PROPERTIES = {"delta.columnMapping.mode": "name", "delta.enableTypeWidening": "true"}


def table_of(target: str) -> str:
    return target + STAGED_SUFFIX


def app_id(target: str, flow: str) -> str:
    """The idempotent-write app id of a flow's stage commits (its own per flow)."""
    return f"autocdc/{target}/staged/{flow}"


@dataclass(frozen=True)
class Status:
    """What a flow holds staged: micro-batches, rows, when the oldest was staged (seconds
    since the epoch), and when the target last committed a batch (None: never, or not
    asked for)."""

    batches: int
    rows: int
    oldest_epoch: float | None
    last_apply: datetime | None = None

    @property
    def age_seconds(self) -> float | None:
        """How long ago the oldest staged change was staged."""
        return None if self.oldest_epoch is None else round(time.time() - self.oldest_epoch, 3)

    @property
    def oldest(self) -> datetime | None:
        if self.oldest_epoch is None:
            return None
        return datetime.fromtimestamp(self.oldest_epoch, tz=timezone.utc)

    def as_dict(self) -> dict[str, object]:
        return {
            "staged_batches": self.batches,
            "staged_rows": self.rows,
            "oldest_staged_at": None if self.oldest is None else self.oldest.isoformat(),
            "oldest_staged_age_seconds": self.age_seconds,
            "last_apply_at": None if self.last_apply is None else self.last_apply.isoformat(),
        }


def version(spark: SparkSession, target: str) -> int:
    """The staging table's Delta version (-1: no table); a listing of its log, no job."""
    name = table_of(target)
    return commit.table_version(spark, name) if tables.exists(spark, name) else -1


@dataclass(frozen=True)
class Known:
    """A flow's staged status as of one version of the staging table: while the table is
    still at that version, nobody staged or applied since, and it need not be read."""

    at: int
    status: Status

    def after_stage(self, rows: int, staged_at: float) -> Status:
        """The status once one micro-batch of ``rows`` rows, staged at ``staged_at``
        (seconds since the epoch), is added."""
        old = self.status
        oldest = staged_at if old.oldest_epoch is None else old.oldest_epoch
        return Status(old.batches + 1, old.rows + rows, oldest)


def last_stage(spark: SparkSession, target: str, flow: str) -> int:
    """The last stage id the flow committed (0: none)."""
    return commit.committed_version(spark, table_of(target), app_id(target, flow))


def append(spark: SparkSession, target: str, flow: str, stage_id: int, rows: DataFrame) -> bool:
    """Append ``rows`` as stage ``stage_id`` of ``flow``; False when Delta skipped it (that
    stage id is already committed: a replay)."""
    name = table_of(target)
    if not tables.exists(spark, name):
        # Every column nullable: a later batch may carry NULLs where the first had none.
        schema = StructType([StructField(f.name, nullable(f.dataType)) for f in rows.schema])
        tables.create(spark, name, schema, _PROPERTIES)
    app = app_id(target, flow)
    if commit.committed_version(spark, name, app) >= stage_id:
        return False
    try:
        (
            rows.write.format("delta")
            .mode("append")
            .option("mergeSchema", "true")
            .option("txnAppId", app)
            .option("txnVersion", stage_id)
            .save(tables.default_location(spark, name))
        )
    except CONFLICTS:
        if commit.committed_version(spark, name, app) < stage_id:
            raise
        return False
    return True


def tagged(rows: DataFrame, flow: str, stage_id: int) -> DataFrame:
    return rows.select(
        "*",
        F.lit(flow).alias(FLOW),
        F.lit(stage_id).cast("long").alias(STAGE),
        F.current_timestamp().alias(STAGED_AT),
    )


@dataclass(frozen=True)
class Read:
    """A flow's staged rows at one version of the staging table (their own columns
    only), and the greatest stage id among them (0: nothing staged)."""

    rows: DataFrame | None
    upto: int
    count: int


def read(spark: SparkSession, target: str, flow: str) -> Read:
    """Every staged row of ``flow``, pinned to the table's current version (one small
    job: the count and the greatest stage id)."""
    name = table_of(target)
    if not tables.exists(spark, name):
        return Read(None, 0, 0)
    version = commit.table_version(spark, name)
    location = tables.default_location(spark, name)
    pinned = spark.read.format("delta").option("versionAsOf", version).load(location)
    mine = pinned.where(col(FLOW) == F.lit(flow))
    row = mine.agg(F.count(F.lit(1)).alias("n"), F.max(STAGE).alias("upto")).first()
    if not row["n"]:
        return Read(None, 0, 0)
    return Read(mine.drop(*COLUMNS), int(row["upto"]), int(row["n"]))


def clear(spark: SparkSession, target: str, flow: str, upto: int) -> None:
    """Delete ``flow``'s staged rows up to stage ``upto`` (they are applied)."""
    name = table_of(target)
    condition = (col(FLOW) == F.lit(flow)) & (col(STAGE) <= F.lit(upto))
    for _ in range(commit.FOLD_EVERY):
        try:
            tables.delta_table(spark, name).delete(condition)
            return
        except CONFLICTS:  # a stage appended meanwhile: its rows are not ours to delete
            continue
    tables.delta_table(spark, name).delete(condition)


def status(spark: SparkSession, target: str, flow: str, last_apply: bool = True) -> Status:
    """What ``flow`` holds staged (one small job), and (``last_apply``) the target's last
    commit time."""
    name = table_of(target)
    applied = None
    if last_apply and tables.exists(spark, target):
        history = tables.delta_table(spark, target).history(1)
        last = history.select(F.unix_micros("timestamp").alias("t")).first()
        applied = None if last is None else datetime.fromtimestamp(last.t / 1e6, tz=timezone.utc)
    if not tables.exists(spark, name):
        return Status(0, 0, None, applied)
    row = (
        tables.read(spark, name)
        .where(col(FLOW) == F.lit(flow))
        .agg(
            F.count_distinct(col(STAGE)).alias("batches"),
            F.count(F.lit(1)).alias("rows"),
            F.min(F.unix_micros(col(STAGED_AT))).alias("oldest"),
        )
        .first()
    )
    oldest = None if row["oldest"] is None else row["oldest"] / 1e6
    return Status(row["batches"], row["rows"], oldest, applied)


def drop(spark: SparkSession, target: str) -> None:
    tables.drop(spark, table_of(target))
