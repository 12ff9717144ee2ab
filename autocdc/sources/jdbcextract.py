"""Read an extraction source's batches from any database, through Spark's JDBC source.

A run's batches (:func:`autocdc.sources.extract.plan`) become the partitions of one JDBC
read (each batch split further on ``partition_column`` when ``num_partitions`` asks), so
the executors read them in parallel and the driver holds no row. The read lands once in
Parquet under the flow's checkpoint folder: the checkpoint's accumulator and the load both
read those files, so they see the same rows even when the table changes meanwhile (a
second query of the table would not). WATERMARK's accumulator is an aggregation; CUSTOM's
``fold`` runs per partition on the executors and ``merge`` combines the partitions'.

Values reach the cursor and the checkpoint as JSON-like values: numbers as numbers (as
Spark's JDBC mapping types them), timestamps and dates as text (``2024-05-01
10:00:00.000000``, which sorts as time). A JDBC driver turns a timestamp into an instant
through the JVM's default zone (a zoneless one, MariaDB's ``DATETIME``, PostgreSQL's
``timestamp``, is taken as the JVM zone's wall clock; PostgreSQL's driver also gives its
connection that zone), so the text is written in that zone (:func:`jvm_zone`): it is the
value the database holds, which a later run's predicate compares in the database, whatever
Spark's session zone is. Spark's session zone alone would shift it by the difference.
Predicates are plain SQL with double-quoted names; a MariaDB session is put in
ANSI_QUOTES mode (and NO_BACKSLASH_ESCAPES, so a literal means what it says). The small
queries a run plans with (the newest values, a limit's edge, a batch's range) aggregate
in the database, typed as their column (``customSchema``): no column is pulled whole. A
limit's edge takes the first rows in the dialect's own way (:func:`edge_sql`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DateType,
    NumericType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from autocdc.engine import CORRUPT_RECORD_CONF
from autocdc.engine import ident as quote
from autocdc.sources.errors import BadBatchError, SourceOptionError
from autocdc.sources.extract import (
    Batch,
    Cursor,
    Extraction,
    Limit,
    Watermark,
    advance,
    ident,
    option_error,
)

TIME_TEXT = "yyyy-MM-dd HH:mm:ss.SSSSSS"
FETCH_ROWS = 10_000  # rows per round trip of a partition's query
DRIVERS = {  # the JDBC URL's subprotocol -> the driver class the session's jars carry
    "postgresql": "org.postgresql.Driver",
    "mariadb": "org.mariadb.jdbc.Driver",
    "sqlite": "org.sqlite.JDBC",
}
# How a dialect takes "the first n rows in this order" (a limit's edge): LIMIT, TOP or SQL's
# FETCH FIRST; a database not named here gets ROW_NUMBER(), which every one with window
# functions takes (SQL:2003).
LIMIT_DIALECTS = {"postgresql", "mariadb", "mysql", "sqlite", "h2", "hsqldb"}
TOP_DIALECTS = {"sqlserver", "jtds"}
FETCH_DIALECTS = {"oracle", "db2", "derby", "as400"}
# MariaDB: standard quoting for the predicates autocdc writes, on every connection the
# driver opens (Spark's sessionInitStatement misses the ones that resolve a schema)
ANSI_SESSION = {"sessionVariables": "sql_mode='ANSI_QUOTES,NO_BACKSLASH_ESCAPES'"}
_PLACEHOLDER = re.compile(r"%%|%s")


@dataclass(frozen=True)
class Table:
    """A table as the JDBC driver describes it (Spark's type mapping)."""

    name: str  # as the SQL names it, quoted
    struct: StructType

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.struct.fieldNames())

    def schema(self, declared: str | None = None) -> str:
        """The Spark schema rows are typed with: ``declared``, else the driver's."""
        if declared is not None:
            return declared
        return ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in self.struct)


def connection(source: Extraction) -> dict[str, str]:
    """The read's JDBC options: the driver, the credentials (the password read now, from
    the environment or a file, and never kept on the source), MariaDB's quoting mode."""
    assert source.url is not None
    subprotocol = source.url.split(":", 2)[1].lower()
    options = {"url": source.url, **source.properties}
    if "driver" not in options:
        if subprotocol not in DRIVERS:
            raise option_error(
                source=source.name,
                option="url",
                problem=f"names the subprotocol {subprotocol!r}, whose driver autocdc "
                f"does not carry (it carries {sorted(DRIVERS)})",
                fix="Put the driver's jar on the session's classpath (spark.jars) and name "
                "its class in properties={'driver': '...'}.",
            )
        options["driver"] = DRIVERS[subprotocol]
    if subprotocol == "mariadb":
        options = ANSI_SESSION | options
    options.setdefault("fetchsize", str(FETCH_ROWS))  # else some drivers hold a whole read
    if source.user is not None:
        options["user"] = source.user
    if source.password_env is not None:
        if source.password_env not in os.environ:
            raise option_error(
                source=source.name,
                option="password_env",
                problem=f"names {source.password_env}, which is not set",
                fix=f"Set {source.password_env} to the password before the run.",
            )
        options["password"] = os.environ[source.password_env]
    elif source.password_file is not None:
        try:
            options["password"] = Path(source.password_file).read_text().splitlines()[0]
        except (OSError, IndexError) as error:
            raise option_error(
                source=source.name,
                option="password_file",
                problem=f"names {source.password_file}, which cannot be read ({error})",
                fix="Give a readable file whose first line is the password.",
            ) from None
    return options


def literal(value: Any) -> str:
    """``value`` as a SQL literal every database reads the same (strings quoted by
    doubling, which ANSI_QUOTES/NO_BACKSLASH_ESCAPES make MariaDB's rule too)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, datetime | date):
        value = value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat()
    if isinstance(value, list | tuple):  # an array (PostgreSQL's literal, as psycopg's)
        items = (
            "NULL" if v is None else '"' + re.sub(r'(["\\])', r"\\\1", str(v)) + '"' for v in value
        )
        value = "{" + ",".join(items) + "}"
    return "'" + str(value).replace("'", "''") + "'"


def predicate(batch: Batch, source: str = "?") -> str:
    """A batch's predicate with its parameters written in as literals (Spark's JDBC reads
    take SQL text, not parameters); as many parameters as placeholders, as psycopg wants.
    The whole scope is ``1 = 1``: SQL Server and Oracle have no ``TRUE``."""
    if batch.where == "TRUE" and not batch.params:
        return "1 = 1"
    slots = [m for m in _PLACEHOLDER.findall(batch.where) if m == "%s"]
    if len(slots) != len(batch.params):
        raise BadBatchError(source=source, value=f"{batch.where!r} with {len(batch.params)} "
                            f"parameters for {len(slots)} placeholders")  # fmt: skip
    params = iter(batch.params)
    return _PLACEHOLDER.sub(lambda m: "%" if m[0] == "%%" else literal(next(params)), batch.where)


SESSION_ZONE = "spark.sql.session.timeZone"


@contextlib.contextmanager
def jvm_zone(spark: SparkSession) -> Iterator[str]:
    """Spark's session zone pinned to the JVM's default zone (returned) while a run reads
    and formats timestamps, so their text is the database's own (see the module's
    docstring); the session's zone is restored after. Executors must run in the driver's
    zone (``-Duser.timezone`` for both), as the driver reads in its own."""
    zone = spark.sparkContext._jvm.java.util.TimeZone.getDefault().getID()  # type: ignore[union-attr]
    before = spark.conf.get(SESSION_ZONE)
    spark.conf.set(SESSION_ZONE, zone)
    try:
        yield zone
    finally:
        spark.conf.set(SESSION_ZONE, before)


def _reader(spark: SparkSession, source: Extraction) -> Any:
    return spark.read.format("jdbc").options(**connection(source))


def _query(
    spark: SparkSession, source: Extraction, sql: str, types: str | None = None
) -> DataFrame:
    """``sql``'s rows; ``types`` (Spark DDL) types its columns: a driver may type an
    aggregate otherwise than its column (SQLite's ``max`` of text is NUMERIC)."""
    reader = _reader(spark, source).option("query", sql)
    return (reader if types is None else reader.option("customSchema", types)).load()


def _typed(table: Table, **columns: str) -> str:
    """``customSchema`` for query columns named as the keys, each typed as the table's
    column it names."""
    return ", ".join(
        f"{quote(alias)} {table.struct[column].dataType.simpleString()}"
        for alias, column in columns.items()
    )


def plain(frame: DataFrame) -> DataFrame:
    """``frame`` with its timestamps and dates as text: the values a cursor's ``fold`` and
    the checkpoint see (the same as the PostgreSQL path's, which sort as time)."""
    columns: list[Column] = []
    for f in frame.schema:
        column = F.col(quote(f.name))
        if isinstance(f.dataType, TimestampType | TimestampNTZType):
            column = F.date_format(column, TIME_TEXT)
        elif isinstance(f.dataType, DateType):
            column = column.cast("string")
        columns.append(column.alias(f.name))
    return frame.select(*columns)


def quoted_table(name: str) -> str:
    """``schema.table`` (or ``table``) quoted part by part; a part already in double
    quotes is kept."""
    parts = re.findall(r'"(?:[^"]|"")*"|[^.]+', name)
    return ".".join(p if p.startswith('"') else ident(p) for p in parts)


def describe(spark: SparkSession, source: Extraction) -> Table:
    """The source's table as the driver types it; its ``cdc_order``, ``partition_column``
    and declared ``columns`` checked against it. A wrong URL, a missing table or a refused
    login fail here, before anything is planned, with the driver's own words."""
    name = quoted_table(source.table)
    try:
        struct = _query(spark, source, f"SELECT * FROM {name} WHERE 1 = 0").schema
    except SourceOptionError:
        raise
    except Exception as error:
        subprotocol = source.url.split(":", 2)[1]  # never the URL: it may hold a password
        raise option_error(
            source=source.name,
            option="table",
            problem=f"could not be read through jdbc:{subprotocol} ({gist(error)})",
            fix="Check the URL, the table's name, the user's password and its SELECT "
            "permission on the table.",
        ) from None
    table = Table(name, struct)
    named = [o.column for o in source.cdc_order]
    if source.partition_column is not None:
        named.append(source.partition_column)
    unknown = [c for c in named if c not in table.columns]
    if unknown:
        raise option_error(
            source=source.name,
            option="cdc_order" if unknown[0] != source.partition_column else "partition_column",
            problem=f"names {unknown}, which {source.table} does not have ({list(table.columns)})",
            fix="Name columns of the table.",
        )
    if source.partition_column is not None and not isinstance(
        struct[source.partition_column].dataType, NumericType
    ):
        raise option_error(
            source=source.name,
            option="partition_column",
            problem=f"names {source.partition_column!r}, which is "
            f"{struct[source.partition_column].dataType.simpleString()}, not a number",
            fix="Name a numeric column (the key, say): batches split into ranges of it.",
        )
    if source.columns is not None:
        declared = StructType.fromDDL(source.columns).fieldNames()
        missing = [c for c in declared if c not in table.columns]
        if missing:
            raise option_error(
                source=source.name,
                option="columns",
                problem=f"declares {missing}, which {source.table} does not have",
                fix=f"Declare columns of the table ({list(table.columns)}).",
            )
    return table


def _one_row(frame: DataFrame) -> dict[str, Any]:
    row = plain(frame).first()
    return {} if row is None else row.asDict()


def newest(spark: SparkSession, source: Extraction, table: Table) -> dict[str, Any]:
    """Per ``cdc_order`` column, the newest value in scope, as the checkpoint holds it."""
    if not source.cdc_order:
        return {}
    picks = ", ".join(
        f"{'min' if o.descending else 'max'}({ident(o.column)}) AS {ident(o.column)}"
        for o in source.cdc_order
    )
    where = predicate(Batch().narrowed(source.where))
    types = _typed(table, **{o.column: o.column for o in source.cdc_order})
    return _one_row(_query(spark, source, f"SELECT {picks} FROM {table.name} WHERE {where}", types))


def dialect(url: str) -> str:
    """The JDBC URL's subprotocol (``jdbc:oracle:thin:@...`` is ``oracle``)."""
    return url.split(":", 2)[1].lower()


def edge_sql(
    dialect: str, table: str, column: str, beyond: str, rows: int, descending: bool
) -> str:
    """The query of a limit's edge in ``dialect``: the ``rows``-th value of ``column``
    (quoted) in its order among the rows matching ``beyond``, as one row, column ``v``."""
    way, pick = ("DESC", "min") if descending else ("ASC", "max")
    rows = int(rows)
    if dialect in LIMIT_DIALECTS:
        inner = f"SELECT {column} AS v FROM {table} WHERE {beyond} ORDER BY v {way} LIMIT {rows}"
    elif dialect in TOP_DIALECTS:
        inner = f"SELECT TOP ({rows}) {column} AS v FROM {table} WHERE {beyond} ORDER BY v {way}"
    elif dialect in FETCH_DIALECTS:
        inner = (
            f"SELECT {column} AS v FROM {table} WHERE {beyond} ORDER BY v {way} "
            f"FETCH FIRST {rows} ROWS ONLY"
        )
    else:
        numbered = (
            f"SELECT {column} AS v, ROW_NUMBER() OVER (ORDER BY {column} {way}) AS n "
            f"FROM {table} WHERE {beyond}"
        )
        return f"SELECT {pick}(v) AS v FROM ({numbered}) edge WHERE n <= {rows}"
    return f"SELECT {pick}(v) AS v FROM ({inner}) edge"


def edge(
    spark: SparkSession, source: Extraction, table: Table, limit: Limit, checkpoint: Any
) -> Any:
    """Where a run with ``limit`` stops (see :func:`autocdc.sources.pgextract.edge`), found
    by the database in its dialect (:func:`edge_sql`)."""
    assert source.url is not None
    column = limit.order.column
    beyond = predicate(limit.beyond(checkpoint).narrowed(source.where))
    sql = edge_sql(
        dialect(source.url), table.name, ident(column), beyond, limit.rows, limit.order.descending
    )
    row = _one_row(_query(spark, source, sql, _typed(table, v=column)))
    # Oracle names an unquoted alias in capitals
    return next((value for name, value in row.items() if name.lower() == "v"), None)


def _ranges(spark: SparkSession, source: Extraction, table: Table, where: str) -> list[str]:
    """``where`` split on ``partition_column`` into ``num_partitions`` ranges between its
    least and greatest value there (NULLs in the first), as Spark splits a numeric column."""
    name = source.partition_column or ""
    column = ident(name)
    sql = f"SELECT min({column}) AS lo, max({column}) AS hi FROM {table.name} WHERE {where}"
    bounds = _query(spark, source, sql, _typed(table, lo=name, hi=name)).first()
    if bounds is None or bounds["lo"] is None or bounds["lo"] == bounds["hi"]:
        return [where]
    lo, hi, n = bounds["lo"], bounds["hi"], source.num_partitions
    whole = isinstance(lo, int)  # whole cuts (rounded up, so above lo) keep an index usable
    cuts = sorted(
        {lo + (-((lo - hi) * i // n) if whole else (hi - lo) * i / n) for i in range(1, n)}
    )
    terms = [f"{column} < {literal(cuts[0])} OR {column} IS NULL"]
    terms += [f"{column} >= {literal(a)} AND {column} < {literal(b)}" for a, b in pairwise(cuts)]
    terms.append(f"{column} >= {literal(cuts[-1])}")
    return [f"({where}) AND ({t})" for t in terms]


def read(
    spark: SparkSession,
    source: Extraction,
    table: Table,
    batches: list[Batch],
    path: Path,
    most: int | None = None,
) -> DataFrame:
    """Every batch, as partitions of one read, written once to Parquet at ``path`` (what
    the load and the accumulators read); the staged rows, as Spark's JDBC source typed
    them. ``most``: the partitions are read by that many tasks at most, each running its
    queries one after another, so the database never sees more at once."""
    predicates = [predicate(b, source.name) for b in batches]
    if source.partition_column is not None:
        predicates = [p for where in predicates for p in _ranges(spark, source, table, where)]
    options = connection(source)
    url = options.pop("url")
    frame = spark.read.jdbc(url, table.name, predicates=predicates, properties=options)
    if most is not None and len(predicates) > most:
        frame = frame.coalesce(most)
    frame.write.mode("overwrite").parquet(str(path))
    return spark.read.parquet(str(path))


def accumulator(cursor: Cursor, checkpoint: Any, rows: DataFrame) -> Any:
    """The next checkpoint's accumulator from the staged rows: WATERMARK's an aggregation,
    a CUSTOM cursor's ``fold`` per partition on the executors, then ``merge``."""
    seed = cursor.seed(checkpoint)
    if isinstance(cursor, Watermark):
        values = plain(rows)
        picks = [
            (F.min if o.descending else F.max)(quote(o.column)).alias(o.column)
            for o in cursor.order
        ]
        return cursor.merge(seed, values.agg(*picks).first().asDict())

    shipped = _by_value(cursor)

    def fold(part: Iterator[Row]) -> Iterator[Any]:
        mine = cloudpickle.loads(shipped)
        acc = mine.seed(checkpoint)
        for row in part:
            acc = mine.fold(acc, row.asDict())
        yield acc

    return advance(cursor, [seed, *plain(rows).rdd.mapPartitions(fold).collect()])


def _by_value(cursor: Cursor) -> bytes:
    """``cursor`` pickled with its class: the module a pipeline's file defines it in is not
    importable on the executors."""
    module = sys.modules.get(type(cursor).__module__)
    if module is None or module.__name__.split(".")[0] in ("autocdc", "builtins"):
        return cloudpickle.dumps(cursor)
    cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(cursor)
    finally:
        cloudpickle.unregister_pickle_by_value(module)


def gist(error: BaseException) -> str:
    """The line of a failed read that says what went wrong (Spark wraps the database's or
    the Python worker's words in its own, and PySpark keeps the JVM's causes apart)."""
    texts, cause = [str(error)], getattr(error, "_cause", None)
    while cause is not None and len(texts) < 10:
        texts.append(str(cause))
        cause = getattr(cause, "_cause", None)
    lines = [
        re.sub(r"^(Caused by: |: )", "", line.strip()) for t in texts for line in t.splitlines()
    ]
    causes = [line for line in lines if re.match(r"^[\w.$]+(Exception|Error): ", line)]
    found = causes[-1] if causes else next((line for line in lines if line), "")
    return f"{type(error).__name__}: {found[:500]}"


def typed(rows: DataFrame, declared: str | None) -> DataFrame:
    """The staged rows as a flow reads them: the declared ``columns`` (each cast to its
    type) or every column, and the corrupt-record column: the row's values as JSON where a
    value does not fit its declared type, so the flow quarantines it instead of changing
    it."""
    corrupt = rows.sparkSession.conf.get(CORRUPT_RECORD_CONF, "_corrupt_record")
    if declared is None:
        return rows.select("*", F.lit(None).cast("string").alias(corrupt))
    fields = StructType.fromDDL(declared).fields
    values, misfits = [], []
    for f in fields:
        raw = F.col(quote(f.name))
        cast = raw.try_cast(f.dataType)
        values.append(cast.alias(f.name))
        misfits.append(raw.isNotNull() & cast.isNull())
    whole = F.to_json(F.struct(*[F.col(quote(c)) for c in rows.columns]))
    bad = F.when(functools.reduce(Column.__or__, misfits), whole)
    return rows.select(*values, bad.cast("string").alias(corrupt))
