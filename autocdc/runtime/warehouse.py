"""Where tables live in the warehouse, and how a session finds them by name.

Tables are path-backed: each lies in a folder of the warehouse (``<warehouse>/<table>`` or
``<warehouse>/<db>.db/<table>``, Spark's managed layout) and is registered by name in the
session catalog. A session starts by registering every Delta table it finds there
(:func:`register_warehouse_tables`), so a table one process created is there, by name, for
the next; the engine's table plumbing (``autocdc.engine.tables``) builds on this layout.
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import urlparse

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

log = logging.getLogger("autocdc")


def _split(name: str) -> tuple[str | None, str]:
    db, _, table = name.rpartition(".")
    return (db or None), table


def quote(name: str) -> str:
    """Quote each part of a (possibly qualified) table name."""
    return ".".join(f"`{part.replace('`', '``')}`" for part in name.split("."))


def warehouse_path(spark: SparkSession) -> Path:
    uri = spark.conf.get("spark.sql.warehouse.dir")
    return Path(urlparse(uri).path if uri.startswith("file:") else uri)


def default_location(spark: SparkSession, name: str) -> str:
    """Spark's managed-table layout: ``<warehouse>/<table>`` or ``<warehouse>/<db>.db/<table>``."""
    db, table = _split(name)
    root = warehouse_path(spark)
    return str(root / f"{db}.db" / table if db and db != "default" else root / table)


def has_commits(table_dir: Path) -> bool:
    """A Delta table exists once its first commit (or a checkpoint) is written."""
    log_dir = table_dir / "_delta_log"
    return any(log_dir.glob("*.json")) or any(log_dir.glob("*.checkpoint*.parquet"))


def create_database(spark: SparkSession, name: str) -> None:
    """Create the database of table ``name`` when it is qualified (``db.table``)."""
    db, _ = _split(name)
    if db:
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote(db)}")


def register(spark: SparkSession, name: str, table_dir: Path) -> None:
    """Register the Delta table in ``table_dir`` by ``name`` (no-op if registered)."""
    create_database(spark, name)
    spark.sql(f"CREATE TABLE IF NOT EXISTS {quote(name)} USING DELTA LOCATION '{table_dir}'")


def register_warehouse_tables(spark: SparkSession) -> list[str]:
    """Register by name every Delta table found in the warehouse folder.

    This is what makes path-backed tables survive the end of a process: the next
    session finds ``<warehouse>/t/_delta_log`` and ``<warehouse>/db.db/t/_delta_log``.
    A folder whose creation never committed (a process killed while creating it) is
    reported and skipped: the next ``apply`` of its flow creates it again.
    """
    root = warehouse_path(spark)
    found: list[str] = []
    for log_dir in sorted(root.glob("*/_delta_log")) + sorted(root.glob("*.db/*/_delta_log")):
        table_dir = log_dir.parent
        parent = table_dir.parent
        name = table_dir.name if parent == root else f"{parent.name[:-3]}.{table_dir.name}"
        if not has_commits(table_dir):
            log.warning("autocdc: skipping %s: no Delta commit yet (creation killed?)", table_dir)
            continue
        try:
            if not spark.catalog.tableExists(name):
                register(spark, name, table_dir)
        except AnalysisException as error:  # one broken folder must not stop a session
            log.warning("autocdc: skipping %s: %s", table_dir, str(error).splitlines()[0])
            continue
        found.append(name)
    return found
