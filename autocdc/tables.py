"""Where a flow's tables live, and how they are created and found again by name.

A flow owns three Delta tables, side by side in the warehouse:

* ``<target>``                     what readers see: user columns only (plus
                                   ``__START_AT``/``__END_AT`` for SCD type 2);
* ``<target>__autocdc_state``      the auxiliary state the engine reconciles against;
* ``<target>__autocdc_quarantine`` rows that could not be applied, with a reason.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

STATE_SUFFIX = "__autocdc_state"
QUARANTINE_SUFFIX = "__autocdc_quarantine"


def _split(name: str) -> tuple[str | None, str]:
    db, _, table = name.rpartition(".")
    return (db or None), table


def quote(name: str) -> str:
    """Quote each part of a (possibly qualified) table or column name."""
    return ".".join(f"`{part.replace('`', '``')}`" for part in name.split("."))


def warehouse_path(spark: SparkSession) -> Path:
    uri = spark.conf.get("spark.sql.warehouse.dir")
    return Path(urlparse(uri).path if uri.startswith("file:") else uri)


def default_location(spark: SparkSession, name: str) -> str:
    """Spark's managed-table layout: ``<warehouse>/<table>`` or ``<warehouse>/<db>.db/<table>``."""
    db, table = _split(name)
    root = warehouse_path(spark)
    return str(root / f"{db}.db" / table if db and db != "default" else root / table)


def exists(spark: SparkSession, name: str) -> bool:
    return spark.catalog.tableExists(name)


def create(
    spark: SparkSession,
    name: str,
    schema: StructType,
    properties: dict[str, str] | None = None,
) -> None:
    """Create an empty path-backed Delta table registered as ``name`` (no-op if present)."""
    db, _ = _split(name)
    if db:
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote(db)}")
    builder = (
        DeltaTable.createIfNotExists(spark)
        .tableName(name)
        .location(default_location(spark, name))
        .addColumns(schema)
    )
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    builder.execute()


def read(spark: SparkSession, name: str) -> DataFrame:
    return spark.read.table(name)


def register_warehouse_tables(spark: SparkSession) -> list[str]:
    """Register by name every Delta table found in the warehouse folder.

    This is what makes path-backed tables survive the end of a process: the next
    session finds ``<warehouse>/t/_delta_log`` and ``<warehouse>/db.db/t/_delta_log``.
    """
    root = warehouse_path(spark)
    found: list[str] = []
    for log in sorted(root.glob("*/_delta_log")) + sorted(root.glob("*.db/*/_delta_log")):
        table_dir = log.parent
        parent = table_dir.parent
        name = table_dir.name if parent == root else f"{parent.name[:-3]}.{table_dir.name}"
        db, _ = _split(name)
        if db:
            spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote(db)}")
        if not exists(spark, name):
            spark.sql(
                f"CREATE TABLE IF NOT EXISTS {quote(name)} USING DELTA LOCATION '{table_dir}'"
            )
        found.append(name)
    return found
