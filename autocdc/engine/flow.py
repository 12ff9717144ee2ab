"""``AutoCdcFlow``: the declared flow plus the one place that chains the steps.

apply(batch): resolve → stage → classify against state → fold → quarantine → commit
state (with the meta row) → sync target → collect tombstones now and then → metrics.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Mapping
from functools import reduce

from pydantic import PrivateAttr
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from autocdc.engine import fit, gc, quarantine, scd1, scd2, stage, sync, tables
from autocdc.engine import state as st
from autocdc.engine.errors import ConcurrentWriteError
from autocdc.engine.metrics import BatchMetrics
from autocdc.engine.sequences import hex_sequence, parse_hex_sequence
from autocdc.engine.spec import END_AT, START_AT, FlowSpec
from autocdc.engine.stage import OP, REASON, SEQ, TRUNCATE, col

CRASH_ENV = "AUTOCDC_TEST_CRASH_AT"
GC_INTERVAL_SECONDS = 3600.0
MAX_ATTEMPTS = 8  # of one batch against writers that keep committing meanwhile


def _wait_after_losing(since: float) -> None:
    """Wait about as long as the lost attempt took (with jitter): a writer that keeps
    losing to a faster one gets a window, and two that retry together drift apart."""
    time.sleep(random.uniform(0.5, 1.5) * (time.perf_counter() - since))


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

    @property
    def _app_id(self) -> str:
        """The Delta transaction app id that orders this flow's state commits."""
        return f"autocdc/{self.state_table}"

    def _prepare_tables(self, spark: SparkSession, fitted: fit.Fit) -> None:
        """Create the tables on the first batch (target first: the state table's existence
        means both exist), or evolve them to the batch's columns."""
        target_fields = list(fitted.target_columns)
        if self.stored_as_scd_type == 2:
            seq = fitted.layout.sequence
            target_fields += [StructField(START_AT, seq), StructField(END_AT, seq)]
        if fitted.creating:
            tables.create(spark, self.target, StructType(target_fields))
            _crash_point("after_target_create")
            st.create(
                spark,
                self.state_table,
                fitted.layout,
                fit.definition(self, fitted.layout.sequence),
            )
        elif fitted.evolving:
            tables.evolve(spark, self.target, target_fields, before=START_AT)
            tables.evolve(spark, self.state_table, fitted.layout.schema().fields, before=None)

    def check(self, df: DataFrame, fresh: bool = False) -> None:
        """Raise what ``apply`` would raise for a batch of ``df``'s schema, writing nothing:
        a runner validates a whole pipeline (a streaming source included) before it runs.
        ``fresh`` checks as for a new target (one a full refresh is about to drop)."""
        stage.check_deterministic(df, self)
        fit.fit(df.sparkSession, self, df, self.state_table, fresh)

    def apply(self, df: DataFrame) -> BatchMetrics:
        """Apply one micro-batch of changes; safe to repeat after a crash.

        Another writer committing to the flow meanwhile makes this batch start over
        against the new state (a few times, then :class:`ConcurrentWriteError`).
        """
        started = time.perf_counter()
        spark = df.sparkSession
        stage.check_deterministic(df, self)
        for _ in range(MAX_ATTEMPTS):
            attempt = time.perf_counter()
            try:
                return self._apply_once(spark, df, started)
            except tables.RETRYABLE:
                self._synced = None  # re-read from the state the winner committed
                _wait_after_losing(attempt)
        raise ConcurrentWriteError(table=self.state_table, attempts=MAX_ATTEMPTS)

    def _apply_once(self, spark: SparkSession, df: DataFrame, started: float) -> BatchMetrics:
        fitted = fit.fit(spark, self, df, self.state_table)
        self._prepare_tables(spark, fitted)
        layout = fitted.layout
        stored = set(layout.key_names + layout.value_names)
        conformed = df.select(*[col(c) for c in df.columns if c not in stored], *fitted.conform)
        # Read the meta row first: every commit takes the batch id after the one read here,
        # so state read later (newer) can only make this writer lose the race, never win it.
        meta_df = st.meta_frame(spark, self.state_table, layout).localCheckpoint()
        meta = st.read_meta(meta_df)
        synced = meta.synced if self._synced is None else self._synced
        staged = stage.stage(conformed, self, layout.key_names, list(df.columns))
        try:
            if self.stored_as_scd_type == 2:
                return self._apply_scd2(
                    spark, staged, layout, fitted.tracked, meta, synced, started
                )
            return self._apply_scd1(spark, staged, layout, meta_df, meta, synced, started)
        finally:
            staged.tagged.unpersist()

    def _apply_scd1(
        self,
        spark: SparkSession,
        staged: stage.StagedBatch,
        layout: st.Layout,
        meta_df: DataFrame,
        meta: st.Meta,
        synced: int,
        started: float,
    ) -> BatchMetrics:
        keys = layout.key_names
        batch_id = meta.batch + 1
        counts_df = staged.tagged.agg(
            F.count(F.lit(1)).alias("rows_in"),
            F.count(col(REASON)).alias("rejected"),
            F.count(F.when(col(REASON).isNull() & (col(OP) == TRUNCATE), 1)).alias("truncates"),
            F.count(F.when(col(REASON).isNull() & (col(OP) != TRUNCATE), 1)).alias("keyed"),
            F.max(F.when(col(REASON).isNull() & (col(OP) == TRUNCATE), col(SEQ))).alias(
                scd1.NEW_TRUNC
            ),
        )  # over the cached batch: cheaper to recompute where used than to checkpoint
        counts = counts_df.drop(scd1.NEW_TRUNC).first()
        truncate = scd1.truncate_horizon(counts_df, meta_df)

        old = st.state_rows(spark, self.state_table)
        truncating = (
            counts["truncates"] > 0
            and truncate.where(
                F.coalesce(col(scd1.NEW_TRUNC) != col(scd1.M_TRUNC), F.lit(True))
            ).count()
            > 0
        )
        if not truncating:  # key-pruned: only the state of keys in this batch
            batch_keys = (
                staged.changes.where(col(OP) != TRUNCATE).select(*[col(k) for k in keys]).distinct()
            )
            old = old.join(batch_keys, keys, "left_semi")
        old = st.current(old, keys).localCheckpoint()  # read once, used twice

        events = scd1.classify(
            staged.changes, old, truncate, layout, self.late_beyond_horizon == "quarantine"
        )
        touched = scd1.fold(events, old, truncate, layout, batch_id).localCheckpoint()
        new_state = touched.where(col(scd1.CHANGED))
        _crash_point("after_stage")

        changed, live, old_live = col(scd1.CHANGED), col(st.LIVE), col(scd1.OLD_LIVE)
        was_tombstone = col(scd1.OLD_EXISTS) & ~old_live

        def total(name: str) -> Column:
            return F.coalesce(F.sum(name), F.lit(0))

        def count(condition: Column) -> Column:
            return F.count(F.when(changed & condition, 1))

        # One pass over the touched keys: the event counts (ev) and the state changes (ns).
        ev = ns = touched.agg(
            total(scd1.N_EVENTS).alias("distinct"),
            total(scd1.N_LATE).alias("late"),
            total(scd1.N_STALE).alias("stale"),
            count(live & (~old_live | col(scd1.IMAGE_CHANGED))).alias("upserted"),
            count(old_live & ~live).alias("deleted"),
            count(~live).alias("tombstones_written"),
            (count(~live & ~was_tombstone) - count(live & was_tombstone)).alias("tombstone_delta"),
            count(col(scd1.CONFLICT)).alias("conflicts"),
            count(F.lit(True)).alias("changed"),
            count(~col(scd1.OLD_EXISTS)).alias("new_keys"),
        ).first()

        quarantined = counts["rejected"] + ev["late"]
        if quarantined:
            late_rows = events.where(col(scd1.LATE)).select(*staged.source_columns, SEQ, REASON)
            self._quarantine(spark, staged, staged.rejected.unionByName(late_rows), batch_id)
        _crash_point("after_quarantine")

        if ns["changed"] == 0 and not quarantined and synced == meta.batch:
            # Nothing to record (e.g. a replay): no commit, the batch id is not used up.
            return self._metrics(
                meta.batch, counts, ev, ns, quarantined, meta.tombstones, 0, started
            )
        tombstones = meta.tombstones + ns["tombstone_delta"]
        grown = st.Meta(
            batch_id, synced, tombstones, meta.rows + ns["changed"], meta.keys + ns["new_keys"]
        )
        new_meta = meta_df.crossJoin(truncate.select(scd1.NEW_TRUNC)).select(
            F.lit(st.META_ROW).alias(st.KIND),
            col(scd1.NEW_TRUNC).alias(st.DEL),
            col(st.FLOOR),
            *st.meta_counters(grown),
            F.current_timestamp().alias(st.UPDATED_AT),
        )
        rows = layout.select(new_state).unionByName(layout.select(new_meta))
        tables.guarded_write(spark, self.state_table, rows, "append", self._app_id, batch_id)
        _crash_point("after_state_commit")

        # Nothing pending from an earlier batch: this batch's new rows are all that changed.
        to_sync = (
            new_state
            if synced == meta.batch
            else sync.pending(spark, self.state_table, layout, after_batch=synced)
        )
        sync.sync_scd1(spark, self.target, layout, to_sync)
        self._synced = batch_id
        _crash_point("after_target_commit")

        collected = 0
        due = self._last_gc is None or time.monotonic() - self._last_gc > GC_INTERVAL_SECONDS
        if (due and tombstones > 0) or gc.compaction_due(grown):
            # Another writer moved on meanwhile: the next batch compacts.
            with contextlib.suppress(*tables.RETRYABLE):
                collected = self._collect(spark, layout)
        return self._metrics(batch_id, counts, ev, ns, quarantined, tombstones, collected, started)

    def _apply_scd2(
        self,
        spark: SparkSession,
        staged: stage.StagedBatch,
        layout: st.Layout,
        tracked: list[str],
        meta: st.Meta,
        synced: int,
        started: float,
    ) -> BatchMetrics:
        """Type 2: log the batch's new changes, then rebuild the touched keys' history."""
        keys = layout.key_names
        batch_id = meta.batch + 1
        counts = staged.tagged.agg(
            F.count(F.lit(1)).alias("rows_in"),
            F.count(col(REASON)).alias("rejected"),
            F.lit(0).alias("truncates"),
            F.count(F.when(col(REASON).isNull(), 1)).alias("keyed"),
        ).first()
        events = scd2.event_rows(staged.changes, layout, batch_id).localCheckpoint()
        logged = tables.read(spark, self.state_table).where(col(st.KIND) == scd2.EVENT_ROW)
        logged = logged.join(
            events.select(*[col(k) for k in keys]).distinct(), keys, "left_semi"
        ).localCheckpoint()
        fields = {f.name: f.dataType for f in layout.schema().fields}
        same = [
            st.comparable(c, fields[c], col(c, "n")).eqNullSafe(
                st.comparable(c, fields[c], col(c, "o"))
            )
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
            self._quarantine(spark, staged, staged.rejected, batch_id)
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
            return self._metrics(meta.batch, counts, stats, ns, quarantined, 0, 0, started)
        grown = st.Meta(batch_id, synced, 0, 0, 0)
        new_meta = layout.select(
            spark.range(1).select(
                F.lit(st.META_ROW).alias(st.KIND),
                *st.meta_counters(grown),
                F.current_timestamp().alias(st.UPDATED_AT),
            )
        )
        rows = new_events.unionByName(new_meta)
        tables.guarded_write(spark, self.state_table, rows, "append", self._app_id, batch_id)
        _crash_point("after_state_commit")
        # Nothing pending from an earlier batch: the touched keys' log is in hand.
        log = (
            logged.join(
                new_events.select(*[col(k) for k in keys]).distinct(), keys, "left_semi"
            ).unionByName(new_events)
            if synced == meta.batch
            else scd2.pending_log(spark, self.state_table, keys, after_batch=synced)
        )
        scd2.sync(spark, self.target, layout, tracked, self.ignore_null_updates, log)
        self._synced = batch_id
        _crash_point("after_target_commit")
        return self._metrics(batch_id, counts, stats, ns, quarantined, 0, 0, started)

    def _quarantine(
        self, spark: SparkSession, staged: stage.StagedBatch, rejected: DataFrame, batch_id: int
    ) -> None:
        rows = quarantine.rows(rejected, staged.source_columns, self.flow_name, batch_id)
        quarantine.write(spark, self.quarantine_table, rows)

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
        target = tables.read(spark, self.target)
        if self.stored_as_scd_type == 1:
            return target
        return target.where(col(END_AT).isNull()).drop(START_AT, END_AT)

    def as_of(self, spark: SparkSession, sequence: object) -> DataFrame:
        """Type 2: the rows as they were at ``sequence`` (a value or a Column of the
        sequence's type), i.e. the versions with ``__START_AT <= sequence < __END_AT``.

        With no ``sequence_by`` the validity columns hold ``_CHANGE_SEQUENCE_NUMBER`` as
        :func:`autocdc.hex_sequence` does (four numeric sections), and ``sequence`` may be
        the text itself: ``flow.as_of(spark, "16/B374D848")``."""
        if self.sequence_by is None and isinstance(sequence, str):
            parse_hex_sequence(sequence)  # a malformed value is an error, not an empty result
            sequence = hex_sequence(F.lit(sequence))
        at = sequence if isinstance(sequence, Column) else F.lit(sequence)
        target = tables.read(spark, self.target)
        alive = (col(START_AT) <= at) & (col(END_AT).isNull() | (col(END_AT) > at))
        return target.where(alive).drop(START_AT, END_AT)

    def collect_tombstones(self, spark: SparkSession) -> int:
        """Compact the state table and collect tombstones older than
        ``tombstone_retention_days`` now; returns how many were collected.

        ``apply`` also does this at most once an hour, and whenever superseded state rows
        outnumber current ones; call it from a maintenance job to control when the state
        table is rewritten. SCD type 2 keeps its whole change log (deletes are history):
        nothing is collected, and nothing is rewritten.
        """
        if self.stored_as_scd_type == 2 or not tables.exists(spark, self.state_table):
            return 0
        layout = st.Layout.of_table(spark, self.state_table)
        for _ in range(MAX_ATTEMPTS):
            attempt = time.perf_counter()
            try:
                return self._collect(spark, layout)
            except tables.RETRYABLE:
                _wait_after_losing(attempt)
        raise ConcurrentWriteError(table=self.state_table, attempts=MAX_ATTEMPTS)

    def _collect(self, spark: SparkSession, layout: st.Layout) -> int:
        self._last_gc = time.monotonic()
        collected, synced = gc.compact(
            spark,
            self.state_table,
            layout,
            self.tombstone_retention_days,
            self._app_id,
            self._synced or 0,
        )
        self._synced = synced
        return collected

    def full_refresh(self, spark: SparkSession) -> None:
        """Drop the target, its state and its quarantine: the next ``apply`` starts over.

        The way to change what the state depends on (keys, the sequence's type, the SCD
        type, ``ignore_null_updates``): replay the source from the start afterwards.
        """
        for table in (self.target, self.state_table, self.quarantine_table):
            tables.drop(spark, table)
        self._synced = None
        self._last_gc = None
