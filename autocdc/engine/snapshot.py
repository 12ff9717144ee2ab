"""``AutoCdcSnapshotFlow``: AUTO CDC FROM SNAPSHOT, each full snapshot turned into changes.

A snapshot is compared with the target's live rows (SCD type 1: the target; type 2: its
open versions, ``__END_AT`` NULL): a key it adds, or whose values it changes (compared
NULL-safely, maps as JSON), is an upsert, a key it lacks is a delete, both at the
snapshot's version; unchanged rows are left out. Those changes are one batch of an inner
:class:`~autocdc.engine.flow.AutoCdcFlow` (``sequence_by`` the version, ``apply_as_deletes``
a flag, both columns kept out of the target), so order independence, SCD type 2 history,
tracked columns and the crash-safe commit are the engine's own. The diff reads the
snapshot and the target once; the writes touch only the changed keys.

**The last version processed** is a property of the target (``autocdc.snapshotVersion``,
beside ``autocdc.snapshotBatch``: the inner flow's committed batch id at that point),
written by a commit of its own once the snapshot's changes committed. A snapshot that
changes nothing is recorded too, so a ``next_snapshot`` function moves on. A crash
between the two commits is harmless:

* before the changes committed, nothing happened: the snapshot is processed again;
* after, the record is one snapshot behind. A Delta source at that version, or a
  ``next_snapshot`` function asked again, gives the same rows; their diff against the
  target, which holds them, is empty, and the version is recorded (the engine completes
  its own state first, as after any crash). A source numbered by run (a view, a table
  that is not Delta) may hold other rows by then, and those must not get the same number:
  changes of two contents at one sequence would tie, and a delete would win. Every
  committed apply takes one batch id, so a numbered snapshot gets the recorded version +
  1 + the batches committed since the record: an attempt whose record was lost has used
  up its number. Numbers only need to ascend; a gap is harmless.

**A target shared with change flows** (``sequence_by`` set, SCD type 1): the snapshot is
placed on the change feed's clock at its position S, as :mod:`autocdc.engine.clock`
defines: one batch of a TRUNCATE at S and an upsert of every row just above S (not a
diff: an unchanged row must still outrank the older changes it covers). The version
numbers above still say which snapshots were processed; S orders them against changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import reduce
from typing import Any, Literal

from delta.tables import DeltaTable
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from autocdc.engine import clock, tables
from autocdc.engine import state as st
from autocdc.engine.errors import (
    ReservedColumnError,
    SnapshotDuplicateKeyError,
    SnapshotInvalidVersionError,
    SnapshotMassDeleteError,
    SnapshotNullKeyError,
    SnapshotPositionError,
    SnapshotSequenceError,
    SnapshotVersionNotNewerError,
)
from autocdc.engine.flow import AutoCdcFlow
from autocdc.engine.metrics import BatchMetrics
from autocdc.engine.spec import ColumnOrSql, FlowDefinition, Running, scd_type_from_str, to_column
from autocdc.engine.stage import any_null
from autocdc.engine.state import comparable
from autocdc.engine.tables import col

# The changes' own columns, which the inner flow keeps out of the target.
VERSION = "__snapshot_version"
DELETED = "__snapshot_deleted"
TRUNCATED = "__snapshot_truncated"  # a target shared with change flows: the cover at S
PROP_VERSION = "autocdc.snapshotVersion"
PROP_BATCH = "autocdc.snapshotBatch"
# Working columns of the diff, dropped before the inner flow sees it: `__autocdc` names,
# which a snapshot cannot carry (the inner flow's check refuses them first).
_ROWS = "__autocdc_snapshot_rows"  # the snapshot's rows with this row's key
_LIVE = "__autocdc_snapshot_live"
_PROBLEM = "__autocdc_snapshot_problem"
_POSITION = "__autocdc_snapshot_position"
_DUPLICATE_KEY, _NULL_KEY = "duplicate key", "null key"
_LONG = range(-(2**63), 2**63)
DEFAULT_MAX_DELETE_FRACTION = 0.5

NextSnapshot = Callable[[int | None], tuple[DataFrame, int] | None]


def diff(snapshot: DataFrame, live: DataFrame, keys: list[str]) -> DataFrame:
    """Every key whose row differs between ``live`` and ``snapshot``, as the snapshot's
    columns (a key the snapshot lacks: its key, NULL values) plus ``DELETED``; a row no
    snapshot may hold (a NULL or duplicate key) comes with ``_PROBLEM`` and ``_ROWS``.

    Columns only one side has compare with NULL on the other, as the inner flow applies
    them (a column a batch leaves out reads NULL)."""
    types = {f.name: f.dataType for f in live.schema.fields}
    types |= {f.name: f.dataType for f in snapshot.schema.fields}
    per_key = Window.partitionBy(*[col(k) for k in keys])
    s = snapshot.withColumn(_ROWS, F.count(F.lit(1)).over(per_key)).alias("s")
    t = live.withColumn(_LIVE, F.lit(True)).alias("t")
    joined = s.join(t, [col(k, "s") == col(k, "t") for k in keys], "full_outer")
    in_snapshot, in_target = col(_ROWS, "s").isNotNull(), col(_LIVE, "t").isNotNull()

    def value(name: str, alias: str, frame: DataFrame) -> Column:
        found = col(name, alias) if name in frame.columns else F.lit(None).cast(types[name])
        return comparable(name, types[name], found)

    same = [value(c, "s", snapshot).eqNullSafe(value(c, "t", live)) for c in types if c not in keys]
    changed = ~reduce(lambda a, b: a & b, same, F.lit(True))
    null_key = reduce(lambda a, b: a | b, [col(k, "s").isNull() for k in keys])
    problem = F.when(in_snapshot & null_key, _NULL_KEY).when(col(_ROWS, "s") > 1, _DUPLICATE_KEY)
    return joined.where(problem.isNotNull() | ~in_snapshot | ~in_target | changed).select(
        *[
            (
                F.when(in_snapshot, col(c, "s")).otherwise(col(c, "t"))
                if c in keys
                else col(c, "s")
            ).alias(c)
            for c in snapshot.columns
        ],
        (~in_snapshot).alias(DELETED),
        problem.alias(_PROBLEM),
        col(_ROWS, "s").alias(_ROWS),
    )


def _version(target: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in _LONG:
        raise SnapshotInvalidVersionError(target=target, got=repr(value)[:200])
    return value


def _delta_version(spark: SparkSession, name: str) -> int | None:
    """The current version of Delta table ``name``; None for a view or another format."""
    try:
        table = DeltaTable.forName(spark, name)
    except AnalysisException as error:
        if error.getCondition() == "DELTA_MISSING_DELTA_TABLE":
            return None
        raise
    return int(table.history(1).first()["version"])


class SnapshotDefinition(BaseModel):
    """A snapshot flow as its user declares it: immutable, validated once, on construction
    (the flow of its changes included: keys, track-history lists), holding no runtime
    state. Parameter names follow Databricks' ``create_auto_cdc_from_snapshot_flow``.

    >>> SnapshotDefinition(target="customers", keys=["id"], stored_as_scd_type="2")
    SnapshotDefinition(target='customers', keys=['id'], stored_as_scd_type=2, ...)
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    target: str = Field(min_length=1, description="Target table, `table` or `db.table`.")
    keys: list[str] = Field(description="Columns that identify a row of a snapshot.")
    stored_as_scd_type: Literal[1, 2] = 1
    track_history_column_list: list[str] | None = None
    track_history_except_column_list: list[str] | None = None
    name: str | None = Field(default=None, description="Flow name; defaults to the target.")
    # A snapshot that would delete more than this share of the target's rows is refused
    # unless the apply expects it: an empty read after a failed export looks exactly like
    # a source whose rows were all deleted. None: no guard.
    max_delete_fraction: float | None = Field(default=DEFAULT_MAX_DELETE_FRACTION, ge=0, le=1)
    sequence_by: ColumnOrSql | None = Field(
        default=None,
        description="autocdc: the snapshot's position on the clock of the change flows "
        "into the same target (an LSN, an offset, a time; of their sequence's type): a "
        "column of the snapshot, the same on every row (kept out of the target), an SQL "
        "expression or Column over its rows, or a literal. Set, the target may be shared "
        "with change flows (SCD type 1); see autocdc.engine.clock.",
    )

    @field_validator("stored_as_scd_type", mode="before")
    @classmethod
    def _scd_type_from_str(cls, value: object) -> object:
        return scd_type_from_str(value)

    @model_validator(mode="after")
    def _check(self) -> SnapshotDefinition:
        if self.sequence_by is not None and self.stored_as_scd_type == 2:
            raise SnapshotSequenceError(
                flow=self.flow_name,
                target=self.target,
                why="SCD type 2 is not supported with `sequence_by` (a snapshot "
                "shares only an SCD type 1 target with change flows)",
                remedy="Use stored_as_scd_type=1, or drop `sequence_by` and give the "
                "snapshot flow a target of its own.",
            )
        FlowDefinition(**self.changes_fields())  # raises what the flow of its changes would
        return self

    def changes_fields(self) -> dict[str, Any]:
        """The definition of the flow that applies each snapshot's changes: the diff's
        deletes, or on a clock shared with change flows (``sequence_by``, SCD type 1) the
        truncate that covers every change at or below the snapshot's position."""
        changes = {
            "target": self.target,
            "keys": self.keys,
            "sequence_by": VERSION,
            "name": self.name,
        }
        if self.sequence_by is not None:
            return {
                **changes,
                "apply_as_truncates": tables.ident(TRUNCATED),
                "except_column_list": [VERSION, TRUNCATED],
            }
        return {
            **changes,
            "apply_as_deletes": tables.ident(DELETED),
            "except_column_list": [VERSION, DELETED],
            "stored_as_scd_type": self.stored_as_scd_type,
            "track_history_column_list": self.track_history_column_list,
            "track_history_except_column_list": self.track_history_except_column_list,
        }

    @property
    def flow_name(self) -> str:
        return self.name or self.target


def _declared(sequence: str) -> str:
    """The type a change flow declared, from its sequence's on the shared clock
    (``struct<sequence:bigint,__autocdc_tier:tinyint>`` -> ``bigint``): the one its user
    wrote, and the one the snapshot's position must have."""
    shared = re.fullmatch(rf"struct<{clock.SEQUENCE_FIELD}:(.+),{clock.TIER_FIELD}:\w+>", sequence)
    return shared[1] if shared else sequence


class AutoCdcSnapshotFlow(Running):
    """A running snapshot flow: its :class:`SnapshotDefinition` (whose fields it reads as
    its own) and the change flow that applies each snapshot's changes; ``apply`` one
    snapshot at its version, or ``run`` a source (a table or view, or a
    ``next_snapshot(latest_version)`` function).

    >>> flow = AutoCdcSnapshotFlow(target="customers", keys=["id"], stored_as_scd_type=2)
    >>> flow.flow_name
    'customers'
    """

    def __init__(self, definition: SnapshotDefinition | None = None, /, **fields: Any) -> None:
        if definition is not None and fields:
            raise TypeError(
                "AutoCdcSnapshotFlow takes a SnapshotDefinition or its fields, not both"
            )
        self.definition = SnapshotDefinition(**fields) if definition is None else definition
        # Its definition was checked with this one's (SnapshotDefinition's validator).
        changes = FlowDefinition.model_construct(**self.definition.changes_fields())
        self._changes = AutoCdcFlow(changes)

    @classmethod
    def of(cls, definition: SnapshotDefinition, **placed: Any) -> AutoCdcSnapshotFlow:
        """The running flow of ``definition`` (validated when it was declared, not again),
        with what a run decides for it (``placed``: its qualified ``target``)."""
        return cls(definition.model_copy(update=placed))

    def last_version(self, spark: SparkSession) -> int | None:
        """The last snapshot version processed (None: none yet, or since a full refresh)."""
        recorded = self._recorded(spark)
        return None if recorded is None else recorded[0]

    def _recorded(self, spark: SparkSession) -> tuple[int, int] | None:
        """(version, inner batch id) of the last record."""
        if not tables.exists(spark, self.target):
            return None
        rows = spark.sql(f"SHOW TBLPROPERTIES {tables.quote(self.target)}").collect()
        props = {r["key"]: r["value"] for r in rows}
        if PROP_VERSION not in props:
            return None
        return int(props[PROP_VERSION]), int(props[PROP_BATCH])

    def check(self, snapshot: DataFrame, fresh: bool = False) -> None:
        """Raise what applying a snapshot of ``snapshot``'s schema would raise before
        reading it, writing nothing (``fresh``: as for a new target)."""
        taken = [c for c in snapshot.columns if c.lower() in (VERSION, DELETED, TRUNCATED)]
        if taken:
            raise ReservedColumnError(columns=taken)
        if self.sequence_by is None:
            changes = snapshot.select(
                "*", F.lit(False).alias(DELETED), F.lit(0).cast("long").alias(VERSION)
            )
            self._changes.check(changes, fresh)
            return
        if not fresh:
            self._check_clock(snapshot)
        self._changes.check(self._upserts(snapshot), fresh)

    def check_clock(self, changes: DataType | str, snapshot: DataFrame, other: str) -> None:
        """Refuse sharing the target with ``other`` (a change flow, or the stored target),
        whose sequence type is ``changes``, unless it is the clock the snapshot's position
        (``sequence_by`` over ``snapshot``) is placed on: checked before anything runs."""
        position = snapshot.select(to_column(self.sequence_by)).schema[0].dataType
        found = changes if isinstance(changes, str) else changes.simpleString()
        if found != clock.shared_type(position).simpleString():
            self._incomparable(found, position.simpleString(), other)

    def _check_clock(self, snapshot: DataFrame) -> None:
        """Against the stored target (once it exists): its sequence type."""
        spark, state = snapshot.sparkSession, self._changes.state_table
        if tables.exists(spark, state):
            stored = st.stored_definition(spark, state).get(st.PROP_SEQUENCE, "")
            self.check_clock(stored, snapshot, "the stored target's")

    def _incomparable(self, changes: str, position: str, other: str) -> None:
        tiered = clock.TIER_FIELD in changes
        raise SnapshotSequenceError(
            flow=self.flow_name,
            target=self.target,
            why=f"{other} sequence is {_declared(changes)}, the snapshot's position "
            f"(`sequence_by`) is {position}"
            + ("" if tiered else ", and the change flows are not declared snapshot_target"),
            remedy="Make `sequence_by` give the change flows' sequence type (CAST it, or "
            "autocdc.hex_sequence for an LSN or a _CHANGE_SEQUENCE_NUMBER), declare "
            "snapshot_target=True on every change flow into the target (a pipeline does "
            "it), and start the target over with a full refresh if it was built without.",
        )

    def apply(
        self, snapshot: DataFrame, version: int, expect_deletes: bool = False
    ) -> BatchMetrics:
        """Apply ``snapshot`` as version ``version``, above the last one processed; the
        metrics are those of its changes (``rows_in``: keys added, changed or deleted).
        ``expect_deletes``: apply it even if it deletes more than ``max_delete_fraction``
        of the target."""
        self._newer(_version(self.target, version), self.last_version(snapshot.sparkSession))
        return self._apply(snapshot, version, expect_deletes)

    def run(
        self,
        spark: SparkSession,
        source: str | NextSnapshot,
        on_applied: Callable[[int, BatchMetrics], None] | None = None,
        expect_deletes: bool = False,
    ) -> dict[int, BatchMetrics]:
        """Apply what ``source`` holds beyond the last version processed; returns each
        applied version's metrics, in version order (``on_applied`` is told as each ends).

        ``source`` is a table or view name, read whole as one snapshot: its version is the
        Delta table's (an unchanged table is not processed again), else one more than the
        last (see the module docstring); or a function ``next_snapshot(latest_version)``
        returning ``(DataFrame, version)``, or None when there is nothing newer, called
        until it returns None, with the last version processed (None before the first).
        ``expect_deletes`` lifts the ``max_delete_fraction`` guard for these snapshots.
        """
        found = (
            self._from_function(spark, source)
            if callable(source)
            else self._from_table(spark, source)
        )
        applied: dict[int, BatchMetrics] = {}
        for snapshot, version in found:
            applied[version] = metrics = self._apply(snapshot, version, expect_deletes)
            if on_applied is not None:
                on_applied(version, metrics)
        return applied

    def _from_function(
        self, spark: SparkSession, next_snapshot: NextSnapshot
    ) -> Iterator[tuple[DataFrame, int]]:
        last = self.last_version(spark)
        while (given := next_snapshot(last)) is not None:
            snapshot, version = self._pair(given)
            self._newer(version, last)
            yield snapshot, version
            last = version

    def _from_table(self, spark: SparkSession, name: str) -> Iterator[tuple[DataFrame, int]]:
        recorded = self._recorded(spark)
        version = _delta_version(spark, name)
        if version is None:  # numbered by run: see the module docstring
            last, batch = recorded or (0, 0)
            yield spark.read.table(name), last + 1 + self._changes.committed_batch(spark) - batch
            return
        last = None if recorded is None else recorded[0]
        if version != last:
            self._newer(version, last)
            yield spark.read.option("versionAsOf", version).table(name), version

    def peek(
        self, spark: SparkSession, source: str | NextSnapshot, fresh: bool = False
    ) -> DataFrame | None:
        """The snapshot ``run`` would start from, checked as by ``check`` and not read: what
        a pipeline checks before anything runs (a table's whatever its version; None: the
        function has nothing newer). A ``next_snapshot`` function is called once."""
        if callable(source):
            given = source(None if fresh else self.last_version(spark))
            if given is None:
                return None
            snapshot, _ = self._pair(given)
        else:
            snapshot = spark.read.table(source)
        self.check(snapshot, fresh)
        return snapshot

    def _pair(self, given: object) -> tuple[DataFrame, int]:
        """A ``next_snapshot`` result as (snapshot, version), or refused."""
        if isinstance(given, tuple) and len(given) == 2 and isinstance(given[0], DataFrame):
            return given[0], _version(self.target, given[1])
        raise SnapshotInvalidVersionError(target=self.target, got=repr(given)[:200])

    def _newer(self, version: int, last: int | None) -> None:
        if last is not None and version <= last:
            raise SnapshotVersionNotNewerError(target=self.target, version=version, last=last)

    def _apply(self, snapshot: DataFrame, version: int, expect_deletes: bool) -> BatchMetrics:
        spark = snapshot.sparkSession
        self.check(snapshot)
        limit = None if expect_deletes else self.max_delete_fraction
        if self.sequence_by is None:
            changes = self._diff(snapshot, version, limit)
        else:
            changes = self._covering(snapshot, version, limit)
        metrics = self._changes.apply(changes)
        props = f"'{PROP_VERSION}' = '{version}', '{PROP_BATCH}' = '{metrics.batch_id}'"
        spark.sql(f"ALTER TABLE {tables.quote(self.target)} SET TBLPROPERTIES ({props})")
        return metrics

    def _rows(self, snapshot: DataFrame) -> list[str]:
        """The snapshot's columns the target takes: all but the one ``sequence_by`` names."""
        named = self.sequence_by if isinstance(self.sequence_by, str) else None
        return [c for c in snapshot.columns if c != named]

    def _upserts(self, snapshot: DataFrame) -> DataFrame:
        """Every row of the snapshot as an upsert just above its position."""
        return snapshot.select(
            *[col(c) for c in self._rows(snapshot)],
            F.lit(False).alias(TRUNCATED),
            clock.tiered(to_column(self.sequence_by), clock.SNAPSHOT).alias(VERSION),
        )

    def _covering(self, snapshot: DataFrame, version: int, limit: float | None) -> DataFrame:
        """The batch that places ``snapshot`` on the shared clock: a TRUNCATE at its
        position and every row as an upsert just above it (the checks of :meth:`_diff`
        first)."""
        rows = self._rows(snapshot)
        position = self._position(snapshot, version)
        self._diff(snapshot.select(*[col(c) for c in rows]), version, limit)
        types = {f.name: f.dataType for f in snapshot.schema.fields}
        cover = position.select(
            *[F.lit(None).cast(types[c]).alias(c) for c in rows],
            F.lit(True).alias(TRUNCATED),
            clock.tiered(col(_POSITION), clock.CHANGE).alias(VERSION),
        )
        return self._upserts(snapshot).unionByName(cover)

    def _position(self, snapshot: DataFrame, version: int) -> DataFrame:
        """The snapshot's position, one row (kept in Spark: a timestamp would pick up the
        driver's time zone in Python); refused unless every row gives the same non-NULL
        value (an empty snapshot: ``sequence_by`` must be a literal)."""
        at = to_column(self.sequence_by)
        null = any_null(at, snapshot.select(at).schema[0].dataType)  # a field of a struct too
        found = snapshot.agg(
            F.min(at).alias(_POSITION),
            F.count(F.lit(1)).alias("rows"),
            F.count(F.when(null, 1)).alias("nulls"),
            F.coalesce(F.min(at) == F.max(at), F.lit(True)).alias("one"),
            F.concat_ws(" to ", F.min(at).cast("string"), F.max(at).cast("string")).alias("says"),
        ).localCheckpoint()
        row = found.first()
        problem = None
        if row["nulls"]:
            problem = f"NULL in {row['nulls']} of its {row['rows']} rows"
        elif not row["one"]:
            problem = f"several values, {row['says']}"
        elif not row["rows"]:
            try:
                found = snapshot.sparkSession.range(1).select(at.alias(_POSITION))
                empty = found.where(null).count()
            except AnalysisException:
                empty = 1
            if empty:
                problem = "no row to read it from (an empty snapshot needs a literal)"
        if problem is not None:
            raise SnapshotPositionError(target=self.target, version=version, found=problem)
        return found.select(_POSITION)

    def _diff(self, snapshot: DataFrame, version: int, limit: float | None) -> DataFrame:
        """The changes that take the target to ``snapshot``, materialized (one pass over
        both); a NULL or duplicate key, or deletes of more than ``limit`` of the target's
        rows, are refused here, before anything is written."""
        spark = snapshot.sparkSession
        if tables.exists(spark, self.target):
            live = self.current(spark)
        else:
            live = spark.createDataFrame([], snapshot.schema)
        checked = diff(snapshot, live, self.keys).localCheckpoint()
        keys = [col(k) for k in self.keys]
        bad = checked.where(col(_PROBLEM).isNotNull()).orderBy(col(_PROBLEM), *keys).first()
        if bad is not None:
            key = {k: bad[k] for k in self.keys}
            if bad[_PROBLEM] == _NULL_KEY:
                nulls = [k for k, v in key.items() if v is None]
                raise SnapshotNullKeyError(
                    target=self.target, version=version, key=key, columns=nulls
                )
            raise SnapshotDuplicateKeyError(
                target=self.target, version=version, key=key, rows=bad[_ROWS]
            )
        if limit is not None:
            self._guard(checked, live, version, limit)
        return checked.select(
            *[col(c) for c in snapshot.columns],
            col(DELETED),
            F.lit(version).cast("long").alias(VERSION),
        )

    def _guard(self, checked: DataFrame, live: DataFrame, version: int, limit: float) -> None:
        """Refuse the diff ``checked`` if it deletes more than ``limit`` of ``live``'s rows
        (counted only when it deletes any)."""
        deletes = checked.where(col(DELETED)).count()
        if not deletes:
            return
        rows = live.count()
        if deletes > limit * rows:
            raise SnapshotMassDeleteError(
                target=self.target,
                version=version,
                deletes=deletes,
                rows=rows,
                share=f"{deletes / rows:.0%}",
                limit=limit,
            )

    def current(self, spark: SparkSession) -> DataFrame:
        """The live rows: for type 2, each key's open version (``__END_AT`` NULL)."""
        return self._changes.current(spark)

    def as_of(self, spark: SparkSession, version: int) -> DataFrame:
        """Type 2: the rows as they were in snapshot ``version`` (or between it and the
        next one)."""
        return self._changes.as_of(spark, version)

    def full_refresh(self, spark: SparkSession) -> None:
        """Drop the target (its recorded version with it), state and quarantine: the next
        run starts from the source's current snapshot."""
        self._changes.full_refresh(spark)
