"""``AutoCdcFlow``: the declared flow plus the one place that chains the steps.

apply(batch): resolve → stage → classify against state → fold → quarantine → commit
state (with the meta row) → sync target → collect tombstones now and then → metrics.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from functools import reduce

from pydantic import PrivateAttr
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField

from autocdc import gc, quarantine, scd1, scd2, stage, sync, tables
from autocdc import state as st
from autocdc.errors import SchemaMismatchError
from autocdc.metrics import BatchMetrics
from autocdc.spec import END_AT, START_AT, FlowSpec
from autocdc.stage import OP, REASON, SEQ, TRUNCATE, col

CRASH_ENV = "AUTOCDC_TEST_CRASH_AT"
GC_INTERVAL_SECONDS = 3600.0


def _crash_point(name: str) -> None:
    """Fault injection for the kill tests: SIGKILL this process at a named step."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class AutoCdcFlow(FlowSpec):
    """A declared Auto CDC flow; ``apply`` one micro-batch at a time.

    >>> flow = AutoCdcFlow(target="customers", keys=["id"], sequence_by="seq",
    ...                    apply_as_deletes="op = 'D'", except_column_list=["op", "seq"])
    >>> flow.state_table
    'customers__autocdc_state'
    """

    _synced: int | None = PrivateAttr(default=None)
    _last_gc: float | None = PrivateAttr(default=None)

    @property
    def state_table(self) -> str:
        return self.target + tables.STATE_SUFFIX

    @property
    def quarantine_table(self) -> str:
        return self.target + tables.QUARANTINE_SUFFIX

    def _layout(self, df: DataFrame) -> tuple[st.Layout, list[str]]:
        """The state layout for this batch's schema, and the SCD2 tracked columns."""
        seq_type = stage.sequence_type(df, self)
        columns = self.resolve(df.columns, seq_type)
        field = {f.name: StructField(f.name, f.dataType) for f in df.schema.fields}
        layout = st.Layout(
            keys=[field[k] for k in columns.keys],
            values=[field[c] for c in columns.payload if c not in columns.keys],
            sequence=seq_type,
            per_column_sequences=self.ignore_null_updates and self.stored_as_scd_type == 1,
        )
        return layout, [c for c in columns.tracked if c not in columns.keys]

    def _prepare_tables(self, spark: SparkSession, layout: st.Layout) -> None:
        """Create target and state on the first batch; later, check the batch fits them."""
        target_fields = layout.keys + layout.values
        if self.stored_as_scd_type == 2:
            target_fields += [
                StructField(START_AT, layout.sequence),
                StructField(END_AT, layout.sequence),
            ]
        if not tables.exists(spark, self.target):
            st.create(spark, self.state_table, layout)
            tables.create(spark, self.target, st.StructType(target_fields))
            return
        have = {f.name: f.dataType for f in spark.read.table(self.target).schema.fields}
        have_seq = spark.read.table(self.state_table).schema[st.UPS].dataType
        want = {f.name: f.dataType for f in target_fields}
        changed = [
            f"{n}: {have[n].simpleString()} -> {t.simpleString()}"
            for n, t in want.items()
            if n in have and have[n] != t
        ]
        if have_seq != layout.sequence:
            changed.append(
                f"sequence_by: {have_seq.simpleString()} -> {layout.sequence.simpleString()}"
            )
        missing = [n for n in have if n not in want]
        unexpected = [n for n in want if n not in have]
        if missing or unexpected or changed:
            raise SchemaMismatchError(
                target=self.target, missing=missing, unexpected=unexpected, changed=changed
            )

    def apply(self, df: DataFrame) -> BatchMetrics:
        """Apply one micro-batch of changes; safe to repeat after a crash."""
        started = time.perf_counter()
        spark = df.sparkSession
        layout, tracked = self._layout(df)
        self._prepare_tables(spark, layout)
        if self.stored_as_scd_type == 2:
            return self._apply_scd2(spark, df, layout, tracked, started)
        keys = layout.key_names

        meta_row = st.meta_frame(spark, self.state_table, layout).first()
        meta = st.read_meta(meta_row)
        meta_df = spark.createDataFrame([meta_row], layout.schema())
        batch_id = meta.batch + 1
        synced = meta.synced if self._synced is None else self._synced

        staged = stage.stage(df, self, keys)
        counts = staged.tagged.agg(
            F.count(F.lit(1)).alias("rows_in"),
            F.count(col(REASON)).alias("rejected"),
            F.count(F.when(col(REASON).isNull() & (col(OP) == TRUNCATE), 1)).alias("truncates"),
            F.count(F.when(col(REASON).isNull() & (col(OP) != TRUNCATE), 1)).alias("keyed"),
            F.max(F.when(col(REASON).isNull() & (col(OP) == TRUNCATE), col(SEQ))).alias("max_t"),
        ).first()
        truncate = scd1.truncate_horizon(spark, counts["max_t"], meta_df, layout)

        old = st.state_rows(spark, self.state_table)
        truncating = (
            counts["max_t"] is not None
            and truncate.where(
                F.coalesce(col(scd1.NEW_TRUNC) != col(scd1.M_TRUNC), F.lit(True))
            ).count()
            > 0
        )
        if not truncating:  # key-pruned: only the state of keys in this batch
            batch_keys = staged.changes.where(col(OP) != TRUNCATE).select(*keys).distinct()
            old = old.join(batch_keys, keys, "left_semi")
        old = st.current(old, keys).localCheckpoint()  # read once, used twice

        events = scd1.classify(
            staged.changes, old, truncate, layout, self.late_beyond_horizon == "quarantine"
        ).localCheckpoint()
        new_state = scd1.fold(events, old, truncate, layout, batch_id).localCheckpoint()
        _crash_point("after_stage")

        ev = events.agg(
            F.count(F.lit(1)).alias("distinct"),
            F.count(F.when(col(scd1.LATE), 1)).alias("late"),
            F.count(F.when(col(scd1.STALE), 1)).alias("stale"),
        ).first()
        live, old_live = col(st.LIVE), col(scd1.OLD_LIVE)
        was_tombstone = col(scd1.OLD_EXISTS) & ~old_live
        ns = new_state.agg(
            F.count(F.when(live & (~old_live | col(scd1.IMAGE_CHANGED)), 1)).alias("upserted"),
            F.count(F.when(old_live & ~live, 1)).alias("deleted"),
            F.count(F.when(~live, 1)).alias("tombstones_written"),
            (
                F.count(F.when(~live & ~was_tombstone, 1))
                - F.count(F.when(live & was_tombstone, 1))
            ).alias("tombstone_delta"),
            F.count(F.when(col(scd1.CONFLICT), 1)).alias("conflicts"),
            F.count(F.lit(1)).alias("changed"),
            F.count(F.when(~col(scd1.OLD_EXISTS), 1)).alias("new_keys"),
        ).first()

        quarantined = counts["rejected"] + ev["late"]
        if quarantined:
            late_rows = events.where(col(scd1.LATE)).select(*staged.source_columns, SEQ, REASON)
            rows = quarantine.rows(
                staged.rejected.unionByName(late_rows),
                staged.source_columns,
                self.flow_name,
                batch_id,
            )
            quarantine.write(spark, self.quarantine_table, rows)
        _crash_point("after_quarantine")

        if ns["changed"] == 0 and not quarantined and synced == meta.batch:
            # Nothing to record (e.g. a replay): no commit, the batch id is not used up.
            staged.tagged.unpersist()
            return self._metrics(
                meta.batch, counts, ev, ns, quarantined, meta.tombstones, 0, started
            )
        tombstones = meta.tombstones + ns["tombstone_delta"]
        new_meta = meta_df.crossJoin(truncate.select(scd1.NEW_TRUNC)).select(
            F.lit(st.META_ROW).alias(st.KIND),
            col(scd1.NEW_TRUNC).alias(st.DEL),
            col(st.FLOOR),
            F.lit(batch_id).alias(st.BATCH),
            F.lit(synced).alias(st.SYNCED),
            F.lit(tombstones).alias(st.TOMBSTONES),
            F.lit(meta.rows + ns["changed"]).alias(st.ROWS),
            F.lit(meta.keys + ns["new_keys"]).alias(st.KEYS),
            F.current_timestamp().alias(st.UPDATED_AT),
        )
        st.append(self.state_table, layout.select(new_state).unionByName(layout.select(new_meta)))
        _crash_point("after_state_commit")

        sync.sync_scd1(spark, self.target, self.state_table, layout, after_batch=synced)
        self._synced = batch_id
        _crash_point("after_target_commit")

        collected = 0
        due = self._last_gc is None or time.monotonic() - self._last_gc > GC_INTERVAL_SECONDS
        grown = st.Meta(
            batch_id, batch_id, tombstones, meta.rows + ns["changed"], meta.keys + ns["new_keys"]
        )
        if (due and tombstones > 0) or gc.compaction_due(grown):
            collected = self._collect(spark, layout)
        staged.tagged.unpersist()
        return self._metrics(batch_id, counts, ev, ns, quarantined, tombstones, collected, started)

    def _apply_scd2(
        self,
        spark: SparkSession,
        df: DataFrame,
        layout: st.Layout,
        tracked: list[str],
        started: float,
    ) -> BatchMetrics:
        """Type 2: log the batch's new changes, then rebuild the touched keys' history."""
        keys = layout.key_names
        meta_row = st.meta_frame(spark, self.state_table, layout).first()
        meta = st.read_meta(meta_row)
        batch_id = meta.batch + 1
        synced = meta.synced if self._synced is None else self._synced

        staged = stage.stage(df, self, keys)
        counts = staged.tagged.agg(
            F.count(F.lit(1)).alias("rows_in"),
            F.count(col(REASON)).alias("rejected"),
            F.lit(0).alias("truncates"),
            F.count(F.when(col(REASON).isNull(), 1)).alias("keyed"),
        ).first()
        events = scd2.event_rows(staged.changes, layout, batch_id).localCheckpoint()
        logged = tables.read(spark, self.state_table).where(col(st.KIND) == scd2.EVENT_ROW)
        logged = logged.join(events.select(*keys).distinct(), keys, "left_semi")
        same = [
            F.col(f"n.`{c}`").eqNullSafe(F.col(f"o.`{c}`"))
            for c in [*keys, st.UPS, st.LIVE, *layout.value_names]
        ]
        new_events = (
            events.alias("n")
            .join(logged.alias("o"), reduce(lambda a, b: a & b, same), "left_anti")
            .localCheckpoint()
        )
        ev = events.agg(F.count(F.lit(1)).alias("distinct")).first()
        new = new_events.agg(
            F.count(F.when(col(st.LIVE), 1)).alias("upserts"),
            F.count(F.when(~col(st.LIVE), 1)).alias("deletes"),
        ).first()
        quarantined = counts["rejected"]
        if quarantined:
            rows = quarantine.rows(staged.rejected, staged.source_columns, self.flow_name, batch_id)
            quarantine.write(spark, self.quarantine_table, rows)
        _crash_point("after_quarantine")

        ns = {
            "upserted": new["upserts"],
            "deleted": new["deletes"],
            "conflicts": 0,
            "tombstones_written": 0,
        }
        stats = {
            "distinct": ev["distinct"],
            "late": 0,
            "stale": ev["distinct"] - new["upserts"] - new["deletes"],
        }
        if new["upserts"] + new["deletes"] == 0 and not quarantined and synced == meta.batch:
            staged.tagged.unpersist()
            return self._metrics(meta.batch, counts, stats, ns, quarantined, 0, 0, started)
        new_meta = layout.select(
            spark.range(1).select(
                F.lit(st.META_ROW).alias(st.KIND),
                F.lit(batch_id).alias(st.BATCH),
                F.lit(synced).alias(st.SYNCED),
                F.lit(0).alias(st.TOMBSTONES),
                F.current_timestamp().alias(st.UPDATED_AT),
            )
        )
        st.append(self.state_table, new_events.unionByName(new_meta))
        _crash_point("after_state_commit")
        scd2.sync(
            spark,
            self.target,
            self.state_table,
            layout,
            tracked,
            self.ignore_null_updates,
            after_batch=synced,
        )
        self._synced = batch_id
        _crash_point("after_target_commit")
        staged.tagged.unpersist()
        return self._metrics(batch_id, counts, stats, ns, quarantined, 0, 0, started)

    def _metrics(
        self,
        batch_id: int,
        counts: Row,
        ev: Row | Mapping[str, int],
        ns: Row | Mapping[str, int],
        quarantined: int,
        tombstones: int,
        collected: int,
        started: float,
    ) -> BatchMetrics:
        return BatchMetrics(
            flow=self.flow_name,
            batch_id=batch_id,
            rows_in=counts["rows_in"],
            upserted=ns["upserted"],
            deleted=ns["deleted"],
            ignored_stale=ev["stale"],
            duplicates_dropped=counts["keyed"] - ev["distinct"],
            conflicts=ns["conflicts"],
            quarantined=quarantined,
            late_beyond_horizon=ev["late"],
            truncates=counts["truncates"],
            tombstones_written=ns["tombstones_written"],
            tombstones_live=tombstones - collected,
            tombstones_collected=collected,
            seconds=round(time.perf_counter() - started, 3),
        )

    def current(self, spark: SparkSession) -> DataFrame:
        """The live rows only: for type 2, each key's open version (``__END_AT`` NULL)."""
        target = spark.read.table(self.target)
        if self.stored_as_scd_type == 1:
            return target
        return target.where(col(END_AT).isNull()).drop(START_AT, END_AT)

    def as_of(self, spark: SparkSession, sequence: object) -> DataFrame:
        """Type 2: the rows as they were at ``sequence`` (a value or a Column of the
        sequence's type), i.e. the versions with ``__START_AT <= sequence < __END_AT``."""
        at = sequence if isinstance(sequence, Column) else F.lit(sequence)
        target = spark.read.table(self.target)
        alive = (col(START_AT) <= at) & (col(END_AT).isNull() | (col(END_AT) > at))
        return target.where(alive).drop(START_AT, END_AT)

    def collect_tombstones(self, spark: SparkSession) -> int:
        """Compact the state table and collect tombstones older than
        ``tombstone_retention_days`` now; returns how many were collected.

        ``apply`` also does this at most once an hour, and whenever superseded state rows
        outnumber current ones; call it from a maintenance job to control when the state
        table is rewritten.
        """
        if not tables.exists(spark, self.state_table):
            return 0
        layout = st.Layout.of_table(spark, self.state_table, self.keys)
        if self._synced is None:
            self._synced = st.read_meta(
                st.meta_frame(spark, self.state_table, layout).first()
            ).synced
        return self._collect(spark, layout)

    def _collect(self, spark: SparkSession, layout: st.Layout) -> int:
        self._last_gc = time.monotonic()
        return gc.compact(
            spark, self.state_table, layout, self.tombstone_retention_days, self._synced or 0
        )
