"""Where a flow's tables live, and how they are created, evolved, committed to and found.

A flow owns three Delta tables, side by side in the warehouse:

* ``<target>``                     what readers see: user columns only (plus
                                   ``__START_AT``/``__END_AT`` for SCD type 2);
* ``<target>__autocdc_state``      the auxiliary state the engine reconciles against;
* ``<target>__autocdc_quarantine`` rows that could not be applied, with a reason;

and a plain folder, ``<target>__autocdc_redo``, where a batch's state rows wait for its
target commit, then, pending, for the next fold into the state table (see
:mod:`autocdc.engine.commit`). Where a table's folder lies, and how a session finds tables
by name, is the warehouse's layout (:mod:`autocdc.runtime.warehouse`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from pathlib import Path

from delta import exceptions as delta_errors
from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructField, StructType

from autocdc.runtime.warehouse import (
    create_database,
    default_location,
    has_commits,
    quote,
    register,
)

STATE_SUFFIX = "__autocdc_state"
QUARANTINE_SUFFIX = "__autocdc_quarantine"
# Characters Delta refuses in column names unless the table maps columns by name.
_NEEDS_MAPPING = set(" ,;{}()\n\t=")
# A table folder without a commit younger than this may be another writer's creation in
# progress (it takes well under a second); an older one is a creation that was killed.
CREATION_GRACE_SECONDS = 10.0

log = logging.getLogger("autocdc")


class LostRace(Exception):
    """Another writer committed first: recompute the batch against the new state."""


# Delta's typed commit conflicts (in delta-spark's Python API they share no base class).
CONFLICTS: tuple[type[Exception], ...] = (
    delta_errors.ConcurrentAppendException,
    delta_errors.ConcurrentDeleteDeleteException,
    delta_errors.ConcurrentDeleteReadException,
    delta_errors.ConcurrentTransactionException,
    delta_errors.ConcurrentWriteException,
    delta_errors.DeltaConcurrentModificationException,
    delta_errors.MetadataChangedException,
    delta_errors.ProtocolChangedException,
)
RETRYABLE: tuple[type[Exception], ...] = (LostRace, *CONFLICTS)


def ident(name: str) -> str:
    """Quote one column name: dots and backticks stay part of it."""
    return f"`{name.replace('`', '``')}`"


def col(name: str, alias: str | None = None) -> Column:
    """A column by its exact name (of the DataFrame aliased ``alias``), whatever it holds."""
    return F.col(ident(name) if alias is None else f"{alias}.{ident(name)}")


def _created_meanwhile(location: Path) -> bool:
    """Whether a table folder without a commit gets one within the creation grace: wait
    while anything in it is younger than that (another writer may be creating it), then
    say. Waiting, rather than counting a lost race, makes a folder a kill left just now
    cost a pause, never a batch's attempts: a single writer never reports a concurrent
    one."""
    while not has_commits(location):
        if time.time() - _last_touched(location) >= CREATION_GRACE_SECONDS:
            return False
        time.sleep(0.2)
    return True


def _last_touched(folder: Path) -> float:
    """The newest modification time of ``folder`` and anything in it (files may go
    while it is listed)."""
    newest = 0.0
    for path in [folder, *folder.rglob("*")]:
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, path.stat().st_mtime)
    return newest


def exists(spark: SparkSession, name: str) -> bool:
    """Registered, or committed in the warehouse by another process (then registered)."""
    if spark.catalog.tableExists(name):
        return True
    location = Path(default_location(spark, name))
    if not has_commits(location):
        return False
    register(spark, name, location)
    return True


def needs_column_mapping(names: list[str]) -> bool:
    return any(set(n) & _NEEDS_MAPPING for n in names)


def _mapping_properties() -> dict[str, str]:
    return {
        "delta.columnMapping.mode": "name",
        "delta.minReaderVersion": "2",
        "delta.minWriterVersion": "5",
    }


def create(
    spark: SparkSession,
    name: str,
    schema: StructType,
    properties: dict[str, str] | None = None,
    cluster_by: list[str] | None = None,
) -> None:
    """Create an empty path-backed Delta table registered as ``name`` (no-op if present),
    with ``properties`` and, given ``cluster_by``, liquid clustering on those columns.

    A folder left by a creation that was killed before its first commit holds no data;
    it is cleared and the table created afresh.
    """
    create_database(spark, name)
    location = Path(default_location(spark, name))
    if location.exists() and not _created_meanwhile(location):
        log.warning("autocdc: clearing %s, a table creation that never committed", location)
        shutil.rmtree(location)
    props = dict(properties or {})
    if needs_column_mapping(schema.names):
        props |= _mapping_properties()
    builder = (
        DeltaTable.createIfNotExists(spark)
        .tableName(name)
        .location(str(location))
        .addColumns(schema)
    )
    for key, value in props.items():
        builder = builder.property(key, value)
    if cluster_by:
        builder = builder.clusterBy(*cluster_by)
    try:
        builder.execute()
    except (AnalysisException, *CONFLICTS) as error:
        if location.exists():  # another writer is creating it (or did): retry
            raise LostRace(f"{name} was created by another writer") from error
        raise


def evolve(spark: SparkSession, name: str, fields: list[StructField], before: str | None) -> None:
    """Give table ``name`` every column of ``fields``: add the missing ones (just before
    column ``before`` when given, else last) and widen the types that grew. Idempotent."""
    schema = read(spark, name).schema
    have = {f.name: f.dataType for f in schema.fields}
    added = [f for f in fields if f.name not in have]
    widened = [f for f in fields if f.name in have and have[f.name] != f.dataType]
    props: dict[str, str] = {}
    if needs_column_mapping([f.name for f in added]):
        props["delta.columnMapping.mode"] = "name"  # the table's protocol is upgraded
    if widened:
        props["delta.enableTypeWidening"] = "true"
    if props:
        pairs = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
        spark.sql(f"ALTER TABLE {quote(name)} SET TBLPROPERTIES ({pairs})")
    for f in widened:
        spark.sql(f"ALTER TABLE {quote(name)} ALTER COLUMN {ident(f.name)} TYPE {_ddl(f.dataType)}")
    if added:
        anchor = None  # add each new column after the previous one, before `before`
        if before in have:
            index = schema.names.index(before)
            anchor = schema.names[index - 1] if index else None
        parts = []
        for f in added:
            position = f" AFTER {ident(anchor)}" if anchor else (" FIRST" if before in have else "")
            parts.append(f"{ident(f.name)} {_ddl(f.dataType)}{position}")
            anchor = f.name if before in have else None
        columns = ", ".join(parts)
        spark.sql(f"ALTER TABLE {quote(name)} ADD COLUMNS ({columns})")


def _ddl(data_type: DataType) -> str:
    """A type as SQL DDL (nested field names quoted as needed)."""
    return StructType([StructField("c", data_type)]).toDDL().split(" ", 1)[1]


def read(spark: SparkSession, name: str) -> DataFrame:
    """Table ``name``, registered first if another process committed it meanwhile."""
    exists(spark, name)
    return spark.read.table(name)


def delta_table(spark: SparkSession, name: str) -> DeltaTable:
    """``DeltaTable.forName``, registered first like ``read``."""
    exists(spark, name)
    return DeltaTable.forName(spark, name)


def drop(spark: SparkSession, name: str) -> None:
    """Drop the table and its folder (a full refresh)."""
    spark.sql(f"DROP TABLE IF EXISTS {quote(name)}")
    shutil.rmtree(default_location(spark, name), ignore_errors=True)
