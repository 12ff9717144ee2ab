"""Where an extraction batch's rows wait for the load: in memory, or staged in files.

A batch's rows are raw: ``data`` (the row as a JSON object) and ``_corrupt_record`` (set
for a row that could not be read). In memory they are Arrow tables the load hands to
Spark at once; staged, each page is a row group of one Parquet file per batch attempt,
so a batch of any size never sits in the driver's memory, and Spark reads the files.
:func:`frame` turns either into the typed rows a flow applies.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from autocdc.sources.postgres import typed_columns

RAW = pa.schema([("data", pa.string()), ("_corrupt_record", pa.string())])
RAW_DDL = "data STRING, _corrupt_record STRING"
Part = pa.Table | Path  # what a batch leaves for the load


class MemorySink:
    def __init__(self) -> None:
        self._tables: list[pa.Table] = []

    def write(self, data: list[str | None], corrupt: list[str | None]) -> None:
        self._tables.append(pa.table([data, corrupt], schema=RAW))

    def close(self) -> Part:
        return pa.concat_tables(self._tables) if self._tables else RAW.empty_table()

    def discard(self) -> None:
        self._tables.clear()


class StagedSink:
    """One Parquet file, opened at the first page."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: pq.ParquetWriter | None = None

    def write(self, data: list[str | None], corrupt: list[str | None]) -> None:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.path, RAW)
        self._writer.write_table(pa.table([data, corrupt], schema=RAW))

    def close(self) -> Part:
        if self._writer is None:
            return RAW.empty_table()
        self._writer.close()
        return self.path

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self.path.unlink(missing_ok=True)


def frame(spark: SparkSession, parts: list[Part], schema: str) -> DataFrame:
    """The batches' rows as one DataFrame of ``schema``'s columns and the corrupt-record
    column. Staged files are read lazily: keep them until the rows are applied."""
    files = [str(p) for p in parts if isinstance(p, Path)]
    tables = [p for p in parts if isinstance(p, pa.Table) and p.num_rows]
    raw = spark.read.schema(RAW_DDL).parquet(*files) if files else None
    if tables:
        loaded = spark.createDataFrame(pa.concat_tables(tables))
        raw = loaded if raw is None else raw.unionByName(loaded)
    if raw is None:
        raw = spark.createDataFrame([], RAW_DDL)
    values, corrupt = typed_columns(raw, schema)
    return raw.select(*values, corrupt)
