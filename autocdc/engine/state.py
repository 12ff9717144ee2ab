"""The auxiliary state table: versioned state rows per key, plus a meta row per batch.

A state row is the key's whole story, compacted: the winning upsert's values, the
sequence of that upsert (``__autocdc_ups``), of the latest delete or truncate
(``__autocdc_del``), and, for ``ignore_null_updates``, the sequence each column was last
set at. The target is a pure projection of the live state rows, so the engine can always
rebuild a key's target row from state alone; that is what makes a crash between the
state commit and the target commit harmless (see :mod:`autocdc.engine.sync`).

The table is append-only between compactions: a batch *appends* the new row of each key
it changes, and a key's current row is its row with the greatest ``__autocdc_batch``.
An append costs a fraction of a MERGE (no join against the table, no file rewrite);
:mod:`autocdc.engine.gc` compacts the table when superseded rows outnumber current ones.

The meta row (``__autocdc_kind = 'M'``, NULL keys) is appended in the same commit as the
state rows, and the newest one counts: the last batch id, the batch the target is known
to be synced to, the truncate horizon (in ``__autocdc_del``), the collected-tombstone
horizon (in ``__autocdc_floor``), the number of live tombstones, and the row and key
counts that decide when to compact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from autocdc.engine import tables
from autocdc.engine.spec import END_AT, RESERVED_PREFIX, START_AT, has_map
from autocdc.engine.stage import col

KIND = "__autocdc_kind"
UPS = "__autocdc_ups"
DEL = "__autocdc_del"
FLOOR = "__autocdc_floor"
LIVE = "__autocdc_live"
BATCH = "__autocdc_batch"
UPDATED_AT = "__autocdc_updated_at"
SYNCED = "__autocdc_synced"
TOMBSTONES = "__autocdc_tombstones"
ROWS = "__autocdc_rows"  # state rows in the table, superseded ones included
KEYS = "__autocdc_keys"  # keys with a state row (live or tombstone)
META_ONLY = (SYNCED, TOMBSTONES, ROWS, KEYS)  # NULL in state rows

STATE_ROW, META_ROW = "S", "M"
_RANK = "__autocdc_rank"

# The definition the state depends on, stored as properties of the state table.
PROP_KEYS = "autocdc.keys"
PROP_SEQUENCE = "autocdc.sequenceType"
PROP_SCD_TYPE = "autocdc.scdType"
PROP_IGNORE_NULL_UPDATES = "autocdc.ignoreNullUpdates"
DEFINITION_FIELDS = {
    "keys": PROP_KEYS,
    "sequence type": PROP_SEQUENCE,
    "stored_as_scd_type": PROP_SCD_TYPE,
    "ignore_null_updates": PROP_IGNORE_NULL_UPDATES,
}

# Working-column names: a fixed one is `__autocdc_<word>` (no double underscore after the
# prefix); one derived from a user column is `__autocdc_<family>__<name>`. User columns
# may not start with `__autocdc`, so no user column and no two working columns collide.
COLUMN_SEQ_FAMILY = "s"


def derived(family: str, name: str) -> str:
    """The working column of ``family`` for user column ``name``."""
    return f"{RESERVED_PREFIX}_{family}__{name}"


def column_seq(name: str) -> str:
    """Per-column sequence (``ignore_null_updates``): when ``name`` was last set."""
    return derived(COLUMN_SEQ_FAMILY, name)


def comparable(name: str, data_type: DataType, source: Column | None = None) -> Column:
    """A value Spark can order and compare: maps are not, so they compare as JSON."""
    value = col(name) if source is None else source
    return F.to_json(value) if has_map(data_type) else value


def same_sql(name: str, data_type: DataType, left: str = "t", right: str = "s") -> str:
    """SQL: column ``name`` of ``left`` equals that of ``right``, NULL-safe (maps as JSON)."""
    a, b = f"{left}.{tables.ident(name)}", f"{right}.{tables.ident(name)}"
    return f"to_json({a}) <=> to_json({b})" if has_map(data_type) else f"{a} <=> {b}"


@dataclass(frozen=True)
class Layout:
    """The state table's columns for one flow."""

    keys: list[StructField]
    values: list[StructField]  # non-key target columns
    sequence: DataType
    per_column_sequences: bool

    @staticmethod
    def user_columns(schema: StructType) -> list[StructField]:
        """A stored table's user columns, in stored order."""
        return [
            StructField(f.name, f.dataType)
            for f in schema.fields
            if not f.name.lower().startswith(RESERVED_PREFIX) and f.name not in (START_AT, END_AT)
        ]

    @classmethod
    def of_table(cls, spark: SparkSession, table: str) -> Layout:
        """The layout of an existing state table (keys from its stored definition)."""
        schema = tables.read(spark, table).schema
        user = cls.user_columns(schema)
        keys = json.loads(stored_definition(spark, table)[PROP_KEYS])
        return cls(
            keys=sorted((f for f in user if f.name in keys), key=lambda f: keys.index(f.name)),
            values=[f for f in user if f.name not in keys],
            sequence=schema[UPS].dataType,
            per_column_sequences=any(f.name.startswith(column_seq("")) for f in schema.fields),
        )

    @property
    def key_names(self) -> list[str]:
        return [f.name for f in self.keys]

    @property
    def value_names(self) -> list[str]:
        return [f.name for f in self.values]

    def schema(self) -> StructType:
        seq = self.sequence
        fields = [StructField(KIND, StringType())]
        fields += [StructField(f.name, f.dataType) for f in self.keys + self.values]
        fields += [StructField(UPS, seq), StructField(DEL, seq), StructField(FLOOR, seq)]
        if self.per_column_sequences:
            fields += [StructField(column_seq(v), seq) for v in self.value_names]
        fields += [
            StructField(LIVE, BooleanType()),
            StructField(BATCH, LongType()),
            StructField(UPDATED_AT, TimestampType()),
            StructField(SYNCED, LongType()),
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


@dataclass(frozen=True)
class Meta:
    batch: int
    synced: int
    tombstones: int
    rows: int
    keys: int


def create(spark: SparkSession, table: str, layout: Layout, definition: dict[str, str]) -> None:
    """Create the state table with its definition in the same (first) commit."""
    tables.create(
        spark,
        table,
        layout.schema(),
        {
            # Deletion vectors keep MERGE from rewriting whole files, and leave each
            # batch's rows in fresh files so `__autocdc_batch > n` skips old files on resync.
            "delta.enableDeletionVectors": "true",
            # Statistics on what the engine filters by, wherever the user's columns put
            # them (Delta's default covers only the first 32 columns), and on nothing else.
            "delta.dataSkippingStatsColumns": f"{KIND},{BATCH}",
            **definition,
        },
    )


def stored_definition(spark: SparkSession, table: str) -> dict[str, str]:
    """The ``autocdc.*`` properties of the state table."""
    rows = spark.sql(f"SHOW TBLPROPERTIES {tables.quote(table)}").collect()
    return {r["key"]: r["value"] for r in rows if r["key"].startswith("autocdc.")}


def state_rows(spark: SparkSession, table: str) -> DataFrame:
    """Every stored state row, superseded versions included."""
    return tables.read(spark, table).where(col(KIND) == STATE_ROW)


def current(rows: DataFrame, keys: list[str]) -> DataFrame:
    """Each key's current row: its row of the greatest batch."""
    newest = Window.partitionBy(*[col(k) for k in keys]).orderBy(col(BATCH).desc())
    return rows.withColumn(_RANK, F.row_number().over(newest)).where(col(_RANK) == 1).drop(_RANK)


def meta_frame(spark: SparkSession, table: str, layout: Layout) -> DataFrame:
    """The meta row as a one-row DataFrame (a default one before the first batch)."""
    stored = tables.read(spark, table).where(col(KIND) == META_ROW)
    default = layout.select(
        spark.range(1).select(
            F.lit(META_ROW).alias(KIND),
            F.lit(0).alias(BATCH),
            F.lit(0).alias(SYNCED),
            F.lit(0).alias(TOMBSTONES),
            F.lit(0).alias(ROWS),
            F.lit(0).alias(KEYS),
        )
    )
    return stored.unionByName(default).orderBy(col(BATCH).desc()).limit(1)


def meta_counters(meta: Meta) -> list[Column]:
    """The meta row's counter columns, as literals."""
    return [
        F.lit(meta.batch).cast("long").alias(BATCH),
        F.lit(meta.synced).cast("long").alias(SYNCED),
        F.lit(meta.tombstones).cast("long").alias(TOMBSTONES),
        F.lit(meta.rows).cast("long").alias(ROWS),
        F.lit(meta.keys).cast("long").alias(KEYS),
    ]


def read_meta(meta: DataFrame) -> Meta:
    """The meta row's counters. Sequence-typed fields (horizons) stay in Spark: sent
    through Python, a timestamp would pass the driver's local time zone."""
    row: Row = meta.select(BATCH, SYNCED, TOMBSTONES, ROWS, KEYS).first()
    return Meta(
        batch=row[BATCH],
        synced=row[SYNCED],
        tombstones=row[TOMBSTONES],
        rows=row[ROWS] or 0,
        keys=row[KEYS] or 0,
    )
