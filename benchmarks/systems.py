"""The systems under test, each behind one small interface: load, apply a batch, read back.

``Floor`` is the least work any engine must do: keep the latest change per key in the
batch and run one Delta MERGE. It trusts arrival order across batches, so late changes
overwrite newer data; it is a speed floor, not a correct engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

import autocdc

KEY, SEQ, OP = "id", "seq", "op"
START_AT, END_AT = "__START_AT", "__END_AT"


def _delta_bytes(spark: SparkSession, table: str) -> int:
    """Size of the table's current Delta snapshot (files it references, not its history)."""
    return int(spark.sql(f"DESCRIBE DETAIL {table}").first()["sizeInBytes"])


def latest_per_key(batch: DataFrame) -> DataFrame:
    """Each key's change of the greatest sequence in the batch (arrival order trusted)."""
    newest = Window.partitionBy(KEY).orderBy(F.desc(SEQ))
    return batch.withColumn("_rn", F.row_number().over(newest)).where("_rn = 1").drop("_rn")


@dataclass
class Floor:
    warehouse: Path
    name: str = "floor"

    @property
    def path(self) -> Path:
        return self.warehouse / self.name

    def table_dirs(self) -> list[Path]:
        return [self.path]

    def load(self, snapshot: DataFrame) -> None:
        snapshot.drop(SEQ, OP).write.format("delta").mode("overwrite").save(str(self.path))

    def apply(self, batch: DataFrame) -> None:
        self.merge(latest_per_key(batch))

    def merge(self, changes: DataFrame) -> None:
        """One MERGE of changes with one row per key (``op`` 'D' deletes)."""
        values = {c: f"s.`{c}`" for c in changes.columns if c not in (SEQ, OP)}
        (
            DeltaTable.forPath(changes.sparkSession, str(self.path))
            .alias("t")
            .merge(changes.alias("s"), f"t.{KEY} = s.{KEY}")
            .whenMatchedDelete(condition=f"s.{OP} = 'D'")
            .whenMatchedUpdate(set=values)
            .whenNotMatchedInsert(condition=f"s.{OP} != 'D'", values=values)
            .execute()
        )

    def result(self, spark: SparkSession) -> DataFrame:
        return spark.read.format("delta").load(str(self.path))

    def snapshot_bytes(self, spark: SparkSession) -> dict[str, int]:
        return {"target": _delta_bytes(spark, f"delta.`{self.path}`")}


@dataclass
class HandScd2(Floor):
    """SCD type 2 as Delta's documentation writes it by hand: the latest change per key,
    staged twice so that one MERGE closes the current version (``__END_AT``) and inserts
    the new one. Like the floor it trusts arrival order (wrong under late data); it is the
    MERGE a user would write for history, the yardstick of autocdc's SCD2."""

    name: str = "merge_scd2"

    def load(self, snapshot: DataFrame) -> None:
        versions = snapshot.select(
            *[c for c in snapshot.columns if c not in (SEQ, OP)],
            F.col(SEQ).alias(START_AT),
            F.lit(None).cast("long").alias(END_AT),
        )
        versions.write.format("delta").mode("overwrite").save(str(self.path))

    def apply(self, batch: DataFrame) -> None:
        latest = latest_per_key(batch)
        values = [c for c in latest.columns if c not in (KEY, SEQ, OP)]

        def differs(old: str) -> str:
            return " OR ".join(f"NOT ({old}.`{c}` <=> s.`{c}`)" for c in values)

        target = DeltaTable.forPath(batch.sparkSession, str(self.path))
        # Read anew (not ``target.toDF()``): the MERGE's source must not share its
        # attributes with the target's plan.
        versions = batch.sparkSession.read.format("delta").load(str(self.path))
        current = versions.where(F.col(END_AT).isNull()).alias("cur")
        # The new version of a key whose current one it replaces: inserted (no merge key).
        opening = (
            latest.alias("s")
            .join(current, F.col(f"s.{KEY}") == F.col(f"cur.{KEY}"))
            .where(f"s.{OP} != 'D' AND ({differs('cur')})")
            .select(F.lit(None).cast("long").alias("_mergekey"), "s.*")
        )
        staged = opening.unionByName(latest.select(F.col(KEY).alias("_mergekey"), "*"))
        inserted = {c: f"s.`{c}`" for c in [KEY, *values]}
        (
            target.alias("t")
            .merge(staged.alias("s"), f"t.{KEY} = s._mergekey AND t.{END_AT} IS NULL")
            .whenMatchedUpdate(
                condition=f"s.{OP} = 'D' OR {differs('t')}", set={END_AT: f"s.{SEQ}"}
            )
            .whenNotMatchedInsert(
                condition=f"s.{OP} != 'D'",
                values={**inserted, START_AT: f"s.{SEQ}", END_AT: "NULL"},
            )
            .execute()
        )


@dataclass
class DiffMerge(Floor):
    """A snapshot's diff to the one before, given for free, in one MERGE: the least any
    snapshot flow must write."""

    name: str = "merge_diff"

    def apply(self, batch: DataFrame) -> None:
        self.merge(batch)


@dataclass
class SnapshotMerge(Floor):
    """A whole snapshot in one hand-written MERGE: rows that differ updated, new keys
    inserted, missing keys deleted (SCD type 1, no history)."""

    name: str = "merge_snapshot"

    def apply(self, batch: DataFrame) -> None:
        values = [c for c in batch.columns if c != KEY]
        differs = " OR ".join(f"NOT (t.`{c}` <=> s.`{c}`)" for c in values)
        (
            DeltaTable.forPath(batch.sparkSession, str(self.path))
            .alias("t")
            .merge(batch.alias("s"), f"t.{KEY} = s.{KEY}")
            .whenMatchedUpdateAll(condition=differs)
            .whenNotMatchedInsertAll()
            .whenNotMatchedBySourceDelete()
            .execute()
        )


@dataclass
class AutoCdc:
    """autocdc into its own target; ``partial``: the target takes partial upserts too."""

    warehouse: Path
    scd_type: int = 1
    name: str = ""
    partial: bool = False

    def __post_init__(self) -> None:
        self.name = self.name or f"autocdc_scd{self.scd_type}"
        self.flow = self._flow(self.name, partial_target=self.partial)

    def _flow(self, name: str, **options: object) -> autocdc.AutoCdcFlow:
        return autocdc.AutoCdcFlow(
            target=self.name,
            name=name,
            keys=[KEY],
            sequence_by=SEQ,
            apply_as_deletes=f"{OP} = 'D'",
            except_column_list=[OP, SEQ],
            stored_as_scd_type=self.scd_type,
            **options,
        )

    def partial_flow(self, columns: list[str]) -> autocdc.AutoCdcFlow:
        """A second flow into the same target whose upserts set ``columns`` only."""
        return self._flow(f"{self.name}_partial", columns_to_update=columns)

    def table_dirs(self) -> list[Path]:
        return [
            self.warehouse / t
            for t in (self.flow.target, self.flow.state_table, self.flow.quarantine_table)
        ]

    def load(self, snapshot: DataFrame) -> None:
        self.flow.apply(snapshot)

    def apply(self, batch: DataFrame) -> autocdc.BatchMetrics:
        return self.flow.apply(batch)

    def result(self, spark: SparkSession) -> DataFrame:
        return spark.table(self.flow.target)

    def snapshot_bytes(self, spark: SparkSession) -> dict[str, int]:
        """Target, state and (once something was quarantined) quarantine table sizes, and
        the pending state's files."""
        tables = {
            "target": self.flow.target,
            "state": self.flow.state_table,
            "quarantine": self.flow.quarantine_table,
        }
        sizes = {
            role: _delta_bytes(spark, name)
            for role, name in tables.items()
            if spark.catalog.tableExists(name)
        }
        # The state rows not yet folded into the state table (and those of the last fold,
        # which the next one removes).
        redo = self.warehouse / f"{self.flow.target}__autocdc_redo"
        sizes["pending"] = sum(p.stat().st_size for p in redo.rglob("*.parquet"))
        return sizes


@dataclass
class SnapshotAutoCdc:
    """``autocdc.AutoCdcSnapshotFlow``: each snapshot at the next version."""

    warehouse: Path
    scd_type: int = 1
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"autocdc_snapshot_scd{self.scd_type}"
        self.flow = autocdc.AutoCdcSnapshotFlow(
            target=self.name, keys=[KEY], stored_as_scd_type=self.scd_type
        )
        self.version = 0

    def table_dirs(self) -> list[Path]:
        return [self.warehouse / f"{self.name}{suffix}" for suffix in ("", "__autocdc_state")]

    def load(self, snapshot: DataFrame) -> None:
        self.flow.apply(snapshot, self.version)

    def apply(self, snapshot: DataFrame) -> None:
        self.version += 1
        self.flow.apply(snapshot, self.version)

    def result(self, spark: SparkSession) -> DataFrame:
        return self.flow.current(spark)
