"""The auxiliary state table: sequences per key, never values, plus a meta row per batch.

A state row says what a key's story is, not what it holds: the sequence of the winning
upsert (``__autocdc_ups``), of the latest delete or truncate (``__autocdc_del``), the
collected-tombstone horizon the key was (re)created above (``__autocdc_floor``), a hash of
the winning upsert's values (``__autocdc_hash``: an equal-sequence upsert with the same
hash is a duplicate, another one a tie that the target MERGE settles against the values
the target holds), and, for a partial target (one that takes upserts setting only some
columns), the sequence each column was last set at. A live key's values are in the
target; a dead key's are gone, as they should be.

The table is append-only between compactions: a batch appends the new row of each key
it changes, and a key's current row is its row of the greatest ``__autocdc_batch``.
:mod:`autocdc.engine.gc` compacts it when superseded rows outnumber current ones.

The meta row (``__autocdc_kind = 'M'``, NULL keys) is appended with every batch: the
batch id, the truncate horizon (in ``__autocdc_del``), the collected-tombstone horizon
(in ``__autocdc_floor``), and the counters that decide when to compact. Horizons only
grow. A flow keeps the meta it last committed in memory and reads the table only when
another writer (or another process) committed since.

SCD type 2 keeps its change log in the same table (``__autocdc_kind = 'E'``, see
:mod:`autocdc.engine.scd2`). Where every column is tracked (and the target is not
partial) a logged upsert's values are those of the version holding its sequence, so the
log keeps only their hash (``PROP_LOG`` = ``hashes``); otherwise the values are history
the target cannot show (a version absorbs changes whose untracked values it replaced in
place), and the log keeps them; for a partial target each logged upsert also lists the
columns it set (``__autocdc_sets``).

A target with sequence groups (docs/semantics.md) keeps, per group, its greatest upsert
and latest delete sequences (``__autocdc_gups__<group>``, ``__autocdc_gdel__<group>``,
of the group's clock type, added when the group's first flow runs), and each column's
sequence of its group's type; the shared ``__autocdc_ups``/``__autocdc_del`` are unused
there, and ``__autocdc_live`` says whether any group is live.

Whether a target is partial is part of its definition, fixed when its tables are
created, whichever of its flows creates them: every flow into one target shares this
table, so its layout cannot depend on the flow that happens to run first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    LongType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from autocdc.engine import tables
from autocdc.engine.errors import StateFormatError
from autocdc.engine.spec import END_AT, RESERVED_PREFIX, START_AT, has_map
from autocdc.engine.tables import col

KIND = "__autocdc_kind"
UPS = "__autocdc_ups"
DEL = "__autocdc_del"
FLOOR = "__autocdc_floor"
HASH = "__autocdc_hash"
LIVE = "__autocdc_live"
BATCH = "__autocdc_batch"
UPDATED_AT = "__autocdc_updated_at"
SETS = "__autocdc_sets"  # SCD type 2, partial target: the value columns an upsert set
TOMBSTONES = "__autocdc_tombstones"
ROWS = "__autocdc_rows"  # state rows in the table, superseded ones included
KEYS = "__autocdc_keys"  # keys with a state row (live or tombstone)
META_ONLY = (TOMBSTONES, ROWS, KEYS)  # NULL in state rows

STATE_ROW, META_ROW, EVENT_ROW = "S", "M", "E"
# Key types Delta keeps file statistics (minimum, maximum) of.
_STATISTICS_TYPES = (NumericType, StringType, DateType, TimestampType, TimestampNTZType)
_RANK = "__autocdc_rank"

# The definition the state depends on, stored as properties of the state table.
PROP_FORMAT = "autocdc.stateFormat"
FORMAT = "2"  # sequences only; format 1 (before it was written) kept every row's values
PROP_KEYS = "autocdc.keys"
PROP_SEQUENCE = "autocdc.sequenceType"
PROP_SCD_TYPE = "autocdc.scdType"
PROP_PARTIAL = "autocdc.partial"
PROP_GROUPS = "autocdc.sequenceGroups"  # JSON: each sequence group's value columns
GROUPS_SEQUENCE = "groups"  # PROP_SEQUENCE of a target with sequence groups
# SCD type 2: what the log keeps of an upsert, "hashes" or (absent: before it was
# written) "values"; fixed when the tables are created.
PROP_LOG = "autocdc.scd2Log"
LOG_HASHES, LOG_VALUES = "hashes", "values"
# Before partial upserts, ignore_null_updates alone made a target partial (same layout).
PROP_IGNORE_NULL_UPDATES = "autocdc.ignoreNullUpdates"
DEFINITION_FIELDS = {
    "keys": PROP_KEYS,
    "sequence type": PROP_SEQUENCE,
    "stored_as_scd_type": PROP_SCD_TYPE,
}

# Working-column names: a fixed one is `__autocdc_<word>` (no double underscore after the
# prefix); one derived from a user column is `__autocdc_<family>__<name>`. User columns
# may not start with `__autocdc`, so no user column and no two working columns collide.
COLUMN_SEQ_FAMILY = "s"
SET_FAMILY = "set"
GROUP_UPS_FAMILY, GROUP_DEL_FAMILY = "gups", "gdel"


def derived(family: str, name: str) -> str:
    """The working column of ``family`` for user column ``name``."""
    return f"{RESERVED_PREFIX}_{family}__{name}"


def column_seq(name: str) -> str:
    """Per-column sequence (SCD type 1, partial target): when ``name`` was last set."""
    return derived(COLUMN_SEQ_FAMILY, name)


def group_ups(group: str) -> str:
    """Sequence group ``group``: its greatest upsert's sequence, in its own clock."""
    return derived(GROUP_UPS_FAMILY, group)


def group_del(group: str) -> str:
    """Sequence group ``group``: its latest delete's sequence, in its own clock."""
    return derived(GROUP_DEL_FAMILY, group)


def set_flag(name: str) -> str:
    """A staged change's flag: whether the upsert sets column ``name`` (partial target)."""
    return derived(SET_FAMILY, name)


def comparable(name: str, data_type: DataType, source: Column | None = None) -> Column:
    """A value Spark can order and compare: maps are not, so they compare as JSON."""
    value = col(name) if source is None else source
    return F.to_json(value) if has_map(data_type) else value


def comparable_sql(name: str, data_type: DataType, alias: str) -> str:
    """SQL: column ``name`` of ``alias`` as :func:`comparable` makes it."""
    ref = f"{alias}.{tables.ident(name)}"
    return f"to_json({ref})" if has_map(data_type) else ref


@dataclass(frozen=True)
class Layout:
    """A flow's columns: keys and values (the target's, in its stored order), the order
    ties compare values in (fixed by the declaration, never by the data), and the state
    table's working columns."""

    keys: list[StructField]
    values: list[StructField]  # non-key target columns, in the target's order
    tie_order: list[str]  # value names: column_list order, else sorted by name
    sequence: DataType
    partial: bool  # upserts may leave columns unset: the state records which they set
    log_values: bool = False  # SCD type 2: the state holds the change log
    # SCD type 2, every column tracked, not partial: a logged upsert keeps a hash of its
    # values (``HASH``), not the values, which its version in the target shows.
    log_hashes: bool = False
    # A target with sequence groups: the batch's group, each value column's group, and
    # each group's clock type known so far (a group's columns and sequences are of it).
    group: str | None = None
    group_of: tuple[tuple[str, str], ...] = ()
    group_types: tuple[tuple[str, DataType], ...] = ()

    @property
    def grouped(self) -> bool:
        return self.group is not None

    def group_layout(self) -> Layout:
        """The batch's group alone: its columns, its clock (what the SCD1 fold runs on)."""
        of = dict(self.group_of)
        values = [f for f in self.values if of.get(f.name) == self.group]
        names = {f.name for f in values}
        return Layout(
            keys=self.keys,
            values=values,
            tie_order=[n for n in self.tie_order if n in names],
            sequence=self.sequence,
            partial=True,
        )

    @property
    def per_column_sequences(self) -> bool:
        """SCD type 1 on a partial target: a sequence per column in each state row."""
        return self.partial and not self.log_values

    @property
    def logs_sets(self) -> bool:
        """SCD type 2 on a partial target: each logged upsert lists the columns it set."""
        return self.partial and self.log_values

    @property
    def key_names(self) -> list[str]:
        return [f.name for f in self.keys]

    @property
    def value_names(self) -> list[str]:
        return [f.name for f in self.values]

    @property
    def tie_fields(self) -> list[StructField]:
        by_name = {f.name: f for f in self.values}
        return [by_name[n] for n in self.tie_order]

    def tie(self, source: str | None = None) -> Column:
        """The values as the tie rule compares them: a struct in ``tie_order``."""
        return F.struct(
            *[
                comparable(
                    f.name, f.dataType, None if source is None else col(f.name, source)
                ).alias(f.name)
                for f in self.tie_fields
            ]
        )

    def identity(self) -> Column:
        """What makes two upserts of one key and sequence the same change: the values as
        ties compare them, and on a partial target which columns it sets (the value of a
        column it does not set is no part of it)."""
        if not self.partial:
            return self.tie()
        return F.struct(
            *[
                F.struct(
                    col(set_flag(f.name)),
                    F.when(col(set_flag(f.name)), comparable(f.name, f.dataType)),
                ).alias(f.name)
                for f in self.tie_fields
            ]
        )

    def schema(self) -> StructType:
        seq = self.sequence
        fields = [StructField(KIND, StringType())]
        fields += [StructField(f.name, f.dataType) for f in self.keys]
        if self.log_values:
            fields += [StructField(f.name, f.dataType) for f in self.values]
        if self.grouped:  # one clock per group: the shared columns are unused
            seq = LongType()
        fields += [StructField(UPS, seq), StructField(DEL, seq), StructField(FLOOR, seq)]
        if self.grouped:
            types, of = dict(self.group_types), dict(self.group_of)
            for group, data_type in self.group_types:
                fields += [
                    StructField(group_ups(group), data_type),
                    StructField(group_del(group), data_type),
                ]
            fields += [StructField(column_seq(v), types[of[v]]) for v in self.value_names]
        elif self.per_column_sequences:
            fields += [StructField(column_seq(v), seq) for v in self.value_names]
        if self.logs_sets:
            fields.append(StructField(SETS, ArrayType(StringType())))
        fields += [
            StructField(HASH, LongType()),
            StructField(LIVE, BooleanType()),
            StructField(BATCH, LongType()),
            StructField(UPDATED_AT, TimestampType()),
            StructField(TOMBSTONES, LongType()),
            StructField(ROWS, LongType()),
            StructField(KEYS, LongType()),
        ]
        return StructType(fields)

    def select(self, df: DataFrame) -> DataFrame:
        """``df`` with exactly the state columns, in order (missing ones as typed NULLs)."""
        return df.select(
            *[
                (col(f.name) if f.name in df.columns else F.lit(None))
                .cast(f.dataType)
                .alias(f.name)
                for f in self.schema().fields
            ]
        )


def user_columns(schema: StructType) -> list[StructField]:
    """A stored table's user columns, in stored order."""
    return [
        StructField(f.name, f.dataType)
        for f in schema.fields
        if not f.name.lower().startswith(RESERVED_PREFIX) and f.name not in (START_AT, END_AT)
    ]


@dataclass(frozen=True)
class Meta:
    """The counters of the newest meta row (horizons stay in Spark: see ``MetaFrame``)."""

    batch: int
    tombstones: int
    rows: int
    keys: int


@dataclass(frozen=True)
class MetaFrame:
    """The newest meta row: its counters, and its horizons (``DEL``: truncates, ``FLOOR``:
    collected tombstones) as a materialized one-row DataFrame. Horizons are of the
    sequence's type and never pass through Python (a timestamp would pick up the
    driver's time zone)."""

    meta: Meta
    horizons: DataFrame
    # Both horizons are NULL (nothing truncated, nothing collected): the reconcile then
    # needs no join with them.
    empty: bool = False


def statistics_columns(layout: Layout) -> str:
    """The state table's ``delta.dataSkippingStatsColumns``: what the engine filters it
    by, wherever the user's columns put them (Delta's default covers only the first 32
    columns), and nothing else. The keys are among them (of the types Delta keeps a
    minimum and maximum of): a batch's key bound then skips the state files that cannot
    hold its keys, which pays where keys arrive together (recent orders, one tenant)."""
    keys = [f.name for f in layout.keys if isinstance(f.dataType, _STATISTICS_TYPES)]
    return ",".join([KIND, BATCH, *[tables.ident(k) for k in keys]])


def create(spark: SparkSession, table: str, layout: Layout, definition: dict[str, str]) -> None:
    """Create the state table with its definition in the same (first) commit."""
    tables.create(
        spark,
        table,
        layout.schema(),
        {
            "delta.dataSkippingStatsColumns": statistics_columns(layout),
            # Only appended and compacted, never updated in place: without deletion
            # vectors a read of it plans without listing them (one Spark job less).
            "delta.enableDeletionVectors": "false",
            PROP_FORMAT: FORMAT,
            **definition,
        },
    )


def stored_definition(spark: SparkSession, table: str) -> dict[str, str]:
    """The ``autocdc.*`` properties of the state table; refuses a state table written in
    an older format (it kept every row's values), which only a full refresh rebuilds."""
    rows = spark.sql(f"SHOW TBLPROPERTIES {tables.quote(table)}").collect()
    props = {r["key"]: r["value"] for r in rows if r["key"].startswith("autocdc.")}
    if props.get(PROP_FORMAT) != FORMAT:
        raise StateFormatError(table=table, found=props.get(PROP_FORMAT, "1"), expected=FORMAT)
    return props


def stored_log_hashes(definition: dict[str, str]) -> bool:
    """Whether the stored SCD type 2 log keeps hashes of upserts' values, not values."""
    return definition.get(PROP_LOG) == LOG_HASHES


def stored_keys(definition: dict[str, str]) -> list[str]:
    return json.loads(definition[PROP_KEYS])


def stored_partial(definition: dict[str, str]) -> bool:
    """Whether the stored target is partial (a state table from before partial upserts
    was, exactly when its flow ignored NULL updates)."""
    return definition.get(PROP_PARTIAL, definition.get(PROP_IGNORE_NULL_UPDATES)) == "true"


def state_rows(stored: DataFrame) -> DataFrame:
    """Every state row of ``stored`` (a state table's rows), superseded ones included."""
    return stored.where(col(KIND) == STATE_ROW)


def current(rows: DataFrame, keys: list[str]) -> DataFrame:
    """Each key's current row: its row of the greatest batch."""
    newest = Window.partitionBy(*[col(k) for k in keys]).orderBy(col(BATCH).desc())
    return rows.withColumn(_RANK, F.row_number().over(newest)).where(col(_RANK) == 1).drop(_RANK)


def _no_horizons(spark: SparkSession, layout: Layout) -> DataFrame:
    return spark.range(1).select(
        F.lit(None).cast(layout.sequence).alias(DEL), F.lit(None).cast(layout.sequence).alias(FLOOR)
    )


def default_meta(spark: SparkSession, layout: Layout) -> MetaFrame:
    """The meta of a flow before its first batch (no Spark job)."""
    return MetaFrame(Meta(0, 0, 0, 0), _no_horizons(spark, layout), empty=True)


def read_meta(spark: SparkSession, rows: DataFrame, layout: Layout) -> MetaFrame:
    """The meta of the state (``rows``: a state table's): the newest meta row's counters,
    and the greatest horizons of all (they only grow; a compaction racing a batch may
    leave the newer horizon in an older row)."""
    stored = rows.where(col(KIND) == META_ROW)
    newest = F.struct(col(BATCH), col(UPDATED_AT))
    counters = F.max_by(F.struct(BATCH, TOMBSTONES, ROWS, KEYS), newest)
    frame = stored.agg(
        counters.alias("counters"), F.max(DEL).alias(DEL), F.max(FLOOR).alias(FLOOR)
    ).localCheckpoint()
    first = frame.first()
    row = first["counters"]
    if row is None:
        return default_meta(spark, layout)
    meta = Meta(
        batch=row[BATCH], tombstones=row[TOMBSTONES] or 0, rows=row[ROWS] or 0, keys=row[KEYS] or 0
    )
    empty = first[DEL] is None and first[FLOOR] is None
    return MetaFrame(meta, frame.select(DEL, FLOOR), empty)


def meta_counters(meta: Meta) -> list[Column]:
    """The meta row's counter columns, as literals."""
    return [
        F.lit(meta.batch).cast("long").alias(BATCH),
        F.lit(meta.tombstones).cast("long").alias(TOMBSTONES),
        F.lit(meta.rows).cast("long").alias(ROWS),
        F.lit(meta.keys).cast("long").alias(KEYS),
    ]


def meta_row(horizons: DataFrame, meta: Meta, layout: Layout) -> DataFrame:
    """The meta row to commit: ``horizons`` (one row: DEL and FLOOR), ``meta``'s counters."""
    return layout.select(
        horizons.select(
            F.lit(META_ROW).alias(KIND),
            col(DEL),
            col(FLOOR),
            *meta_counters(meta),
            F.current_timestamp().alias(UPDATED_AT),
        )
    )
