"""Debezium change events (JSON) as change rows an AutoCdcFlow applies.

An event value is a Debezium envelope, bare or wrapped as ``{"schema": ..., "payload":
...}``: ``op`` (``c`` create, ``r`` snapshot read, ``u`` update, ``d`` delete, ``t``
truncate), the row ``before`` and ``after`` the change, and ``source``, where in the
database's log the change is. Each becomes one change row in the BigQuery CDC shape:

- the row's columns, from ``after`` (from ``before`` for a delete; all NULL for a truncate);
- ``_CHANGE_TYPE``: ``UPSERT``, ``DELETE`` or ``TRUNCATE``;
- ``_CHANGE_SEQUENCE_NUMBER``: the change's position in commit order, as hex sections
  separated by ``/`` (order it with :func:`autocdc.hex_sequence`), never processing time.

The position, section by section (each an unsigned 64-bit number in hex):

- first, ``0`` for a snapshot read (``source.snapshot`` set and not ``false`` or
  ``incremental``) and ``1`` for a change: a snapshot is the starting state, and every
  change streamed after it is newer, even one whose log position is lower (a PostgreSQL
  transaction that began before the snapshot and committed after it). Snapshot reads
  order among themselves by position: a later snapshot wins over an earlier one.
- PostgreSQL: ``C/L``. Change LSNs of concurrent transactions interleave, so ``lsn``
  alone is not commit order. Debezium's ``source.sequence`` is ``["<lastCommitLsn>",
  "<lsn>"]`` (decimal strings): events arrive a whole transaction at a time in commit
  order, and the last commit LSN seen grows with each transaction. ``L`` is the event's
  LSN (``sequence[1]``, else ``source.lsn``) and ``C`` is the greater of the last commit
  LSN and ``L``: still commit order when the last commit LSN is NULL (the first
  transaction a new connector streams), and whether Debezium reports the previous
  transaction's commit LSN (today) or the enclosing one's. Without ``sequence``
  (Debezium before 1.5) ``C`` is ``L``: plain LSN order, which misorders interleaved
  transactions that change the same row.
- MySQL: ``F/P/R``: the binlog file's number (``mysql-bin.000003`` is 3: names stop
  sorting as text past ``.999999``), ``pos`` and ``row``. The binlog is written in commit
  order. ``row`` may be absent (0).

With ``transaction_id`` set, the change's transaction is added as a text column of that
name: the ``transaction.id`` of Debezium's transaction metadata when the connector sends
it (``provide.transaction.metadata``), else PostgreSQL's ``source.txId`` or MySQL's
``source.gtid`` (NULL without GTIDs). Like any column, it is stored in the target unless
the flow leaves it out.

An event that cannot be mapped (not JSON, a field of the wrong type, an unknown or NULL
``op``, no ``after`` for ``c``/``r``/``u`` or ``before`` for ``d``, a missing or malformed
position) is kept, with its raw text in Spark's corrupt-record column: the flow
quarantines it as ``AUTOCDC_MALFORMED_RECORD`` and goes on. A NULL or blank value (a
Kafka tombstone after a delete, an empty line) carries no change and is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Literal

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StringType, StructField, StructType

from autocdc.engine import (
    CHANGE_SEQUENCE_NUMBER,
    CHANGE_TYPE,
    CORRUPT_RECORD_CONF,
    DELETE,
    NO_CHANGE,
    TRUNCATE,
    UPSERT,
    UnknownConnectorError,
    hex_sequence,
    ident,
)
from autocdc.sources import kafkabroker, kafkaclient
from autocdc.sources.debezium_schema import row_schema_of
from autocdc.sources.errors import (
    DebeziumSchemaChangedError,
    DebeziumSchemaError,
    DebeziumTopicsError,
)

Connector = Literal["postgresql", "mysql"]
CONNECTORS: tuple[str, ...] = ("postgresql", "mysql")

MAX_UNSIGNED_64 = Decimal(2**64 - 1)
# The newest events per partition whose schemas make a source's row schema.
SCHEMA_SAMPLE = 100


def _unsigned(text: Column) -> Column:
    """A decimal text as a number, NULL unless it is a whole number from 0 to 2^64 - 1."""
    number = F.when(text.rlike(r"^[0-9]{1,20}$"), text.try_cast("decimal(20,0)"))
    return F.when(number <= F.lit(MAX_UNSIGNED_64), number)


def _hex(number: Column) -> Column:
    return F.conv(number.cast("string"), 10, 16)


# A field of an event's ``source`` block, as text (NULL when absent), by name: from its JSON
# text, or from the block parsed with every field as text (SOURCE_FIELDS).
Field = Callable[[str], Column]
SOURCE_FIELDS = ("sequence", "lsn", "snapshot", "file", "pos", "row", "schema", "db", "table",
                 "txId", "gtid")  # fmt: skip


def _in_json(source: Column) -> Field:
    return lambda name: F.get_json_object(source, f"$.{name}")


def _change_rank(field: Field) -> Column:
    """0 for a snapshot read, 1 for a change (see the module docstring)."""
    snapshot = F.lower(field("snapshot"))
    return F.when(snapshot.isNull() | snapshot.isin("false", "incremental"), 1).otherwise(0)


def _postgres_position(field: Field, sequence: Column | None = None) -> Column:
    """``sequence``: ``field("sequence")`` parsed, when the caller has it already."""
    sequence_text = field("sequence")
    if sequence is None:
        sequence = F.from_json(sequence_text, "array<string>")
    last_commit_text = F.get(sequence, 0)
    last_commit = _unsigned(last_commit_text)
    lsn = _unsigned(F.coalesce(F.get(sequence, 1), field("lsn")))
    sequence_ok = sequence_text.isNull() | F.coalesce(
        (F.size(sequence) == 2) & (last_commit_text.isNull() | last_commit.isNotNull()),
        F.lit(False),
    )
    position = F.format_string(
        "%d/%s/%s", _change_rank(field), _hex(F.greatest(last_commit, lsn)), _hex(lsn)
    )
    return F.when(sequence_ok & lsn.isNotNull(), position)


def _mysql_position(field: Field) -> Column:
    file_number = _unsigned(F.regexp_extract(field("file"), r"\.([0-9]+)$", 1))
    pos = _unsigned(field("pos"))
    row = _unsigned(F.coalesce(field("row"), F.lit("0")))
    position = F.format_string(
        "%d/%s/%s/%s", _change_rank(field), _hex(file_number), _hex(pos), _hex(row)
    )
    return F.when(file_number.isNotNull() & pos.isNotNull() & row.isNotNull(), position)


def debezium_position(connector: Connector, source: Column) -> Column:
    """The ``_CHANGE_SEQUENCE_NUMBER`` of an event from its ``source`` block as JSON text;
    NULL when the position is missing or malformed."""
    _check(connector)
    return _position(connector, _in_json(source))


def _check(connector: str) -> None:
    """Refused before any column is built: building one needs a running Spark."""
    if connector not in CONNECTORS:
        raise UnknownConnectorError(connector=connector, connectors=list(CONNECTORS))


def _position(connector: Connector, field: Field, sequence: Column | None = None) -> Column:
    """The connector's position from the ``source`` fields (PostgreSQL's ``sequence``
    already parsed, when the caller has it)."""
    if connector == "postgresql":
        return _postgres_position(field, sequence)
    return _mysql_position(field)


def debezium_sequence(connector: Connector, source: str | Column = "source") -> Column:
    """The commit-order position of a Debezium event from its parsed ``source`` struct, as
    a ``sequence_by`` value; NULL (so quarantined) when missing or malformed.

    The same order as :func:`debezium_changes`' ``_CHANGE_SEQUENCE_NUMBER``:

    >>> flow = AutoCdcFlow(target="t", keys=["id"], sequence_by=debezium_sequence("mysql"),
    ...                    except_column_list=["source"])  # doctest: +SKIP
    """
    _check(connector)
    block = F.col(source) if isinstance(source, str) else source
    return hex_sequence(debezium_position(connector, F.to_json(block)))


def _envelope(row: DataType) -> StructType:
    return StructType(
        [
            StructField("op", StringType()),
            StructField("before", row),
            StructField("after", row),
            # Each field as text, whatever its JSON type: the fields that place a change.
            StructField(
                "source", StructType([StructField(n, StringType()) for n in SOURCE_FIELDS])
            ),
            StructField("transaction", StructType([StructField("id", StringType())])),
        ]
    )


def _source_table(connector: Connector, source: Column) -> Column:
    """The table an event's parsed ``source`` block names: ``schema.table`` (PostgreSQL)
    or ``db.table`` (MySQL); NULL when it names none."""
    space, name = source["schema" if connector == "postgresql" else "db"], source["table"]
    return F.when(name.isNotNull(), F.concat_ws(".", space, name))


def _transaction(connector: Connector, event: Column) -> Column:
    """The event's transaction id as text (see the module docstring)."""
    own = event["source"]["txId" if connector == "postgresql" else "gtid"]
    return F.coalesce(event["transaction"]["id"], own)


def _refuse_new_columns(text: Column, row: StructType, table: str | None) -> Column:
    """NULL, or (raised) the error for an event whose ``after`` has fields ``row`` lacks."""
    image = F.coalesce(*(F.get_json_object(text, f"$.{at}after") for at in ("payload.", "")))
    extra = F.array_except(F.json_object_keys(image), F.array(*map(F.lit, row.names)))
    said = DebeziumSchemaChangedError(table=table or "the topics", columns="\0")
    head, tail = str(said).split("\0")
    message = F.concat(F.lit(head), F.array_join(extra, ", "), F.lit(tail))
    return F.when(F.coalesce(F.size(extra), F.lit(0)) > 0, F.raise_error(message))


def debezium_changes(
    events: DataFrame,
    row_schema: str | StructType,
    connector: Connector,
    value: str = "value",
    table: str | None = None,
    transaction_id: str | None = None,
    new_columns: Literal["ignore", "fail"] = "ignore",
    mark_tombstones: bool = False,
) -> DataFrame:
    """Debezium event values (JSON text or bytes, e.g. Kafka's ``value`` or the lines of
    ``spark.read.text``) as change rows: ``row_schema``'s columns, ``_CHANGE_TYPE``,
    ``_CHANGE_SEQUENCE_NUMBER`` and the corrupt-record column (the raw text of an event
    that cannot be mapped, else NULL). Lazy: works on a streaming DataFrame too.

    ``row_schema`` describes ``before``/``after`` as Debezium writes them (e.g. a
    PostgreSQL timestamp is epoch microseconds: read it as BIGINT and convert later).
    ``table`` (``schema.table``, MySQL ``db.table``) keeps only that table's events, for a
    topic that carries several; an event that names no table cannot be placed and is kept,
    to be quarantined. Tombstones (a NULL or blank value, or ``{"schema": null,
    "payload": null}``) carry no change and are skipped. ``transaction_id``: the name of a
    column to add with each change's transaction id. ``new_columns``: what an event whose
    ``after`` has fields ``row_schema`` lacks does: ``ignore`` (the declared columns are
    the ones taken) or ``fail`` the query (:class:`DebeziumSchemaChangedError`'s text), so
    a schema taken from the events is taken again before such an event is applied.
    ``mark_tombstones``: keep each tombstone as a row marked
    :data:`~autocdc.engine.NO_CHANGE` (every other column NULL), which a flow
    counts as ``skipped``, rather than leave it out.

    >>> changes = debezium_changes(spark.read.text("events/"), "id INT, name STRING",
    ...                            "postgresql")  # doctest: +SKIP
    >>> AutoCdcFlow(target="customers", keys=["id"]).apply(changes)  # doctest: +SKIP
    """
    if connector not in CONNECTORS:
        raise UnknownConnectorError(connector=connector, connectors=list(CONNECTORS))
    row = DataType.fromDDL(row_schema) if isinstance(row_schema, str) else row_schema
    corrupt = str(events.sparkSession.conf.get(CORRUPT_RECORD_CONF, "_corrupt_record"))
    envelope = _envelope(row)
    schema = StructType(
        [
            StructField("payload", envelope),
            *envelope.fields,
            StructField(corrupt, StringType()),
        ]
    )
    text = F.col(value).cast("string")
    parsed = events.select(
        text.alias("raw"),
        F.from_json(text, schema, {"columnNameOfCorruptRecord": corrupt}).alias("e"),
    )
    e = F.col("e")
    # A NULL or blank value, or a wrapper whose payload is JSON null: the old-style
    # tombstone of a delete.
    tombstone = F.coalesce(F.trim(F.col("raw")) == "", F.lit(True)) | F.coalesce(
        e[corrupt].isNull()
        & e["payload"].isNull()
        & e["op"].isNull()
        & F.col("raw").rlike(r'"payload"\s*:\s*null'),
        F.lit(False),
    )
    parsed = parsed.withColumn(NO_CHANGE, tombstone)
    if not mark_tombstones:
        parsed = parsed.where(~F.col(NO_CHANGE))
    # The event, and its parsed sequence, projected once: every expression below reads
    # them, and Spark keeps a projection of its own for what is read more than once.
    parsed = parsed.select(
        "raw",
        NO_CHANGE,
        F.col(f"e.{corrupt}").alias("__corrupt"),
        F.when(e["payload"].isNotNull(), e["payload"])
        .otherwise(F.struct(*[e[name] for name in envelope.names]))
        .alias("__event"),
    )
    event = F.col("__event")
    source = event["source"]
    if table is not None:
        named = _source_table(connector, source)
        parsed = parsed.where(F.coalesce(named == F.lit(table), F.lit(True)))
    sequence = None
    if connector == "postgresql":
        sequence = F.col("__sequence")
        parsed = parsed.withColumn("__sequence", F.from_json(source["sequence"], "array<string>"))
    op = event["op"]
    image = F.when(op == "d", event["before"]).when(op != "t", event["after"])
    change_type = F.when(op.isin("c", "r", "u"), UPSERT).when(op == "d", DELETE)
    change_type = change_type.when(op == "t", TRUNCATE)
    position = _position(connector, source.getField, sequence)
    if new_columns == "fail":
        position = F.coalesce(_refuse_new_columns(F.col("raw"), row, table), position)
    mapped = (
        F.col("__corrupt").isNull()
        & change_type.isNotNull()
        & ((op == "t") | image.isNotNull())
        & position.isNotNull()
    )
    added = [transaction_id] if transaction_id else []
    marked = [NO_CHANGE] if mark_tombstones else []
    unmapped = ~F.coalesce(mapped, F.lit(False)) & ~F.col(NO_CHANGE)
    return parsed.select(
        image.alias("image"),
        *[_transaction(connector, event).alias(name) for name in added],
        change_type.alias(CHANGE_TYPE),
        position.alias(CHANGE_SEQUENCE_NUMBER),
        F.when(unmapped, F.col("raw")).alias(corrupt),
        *map(F.col, marked),
    ).select(
        "image.*",
        *[F.col(ident(n)) for n in [*added, CHANGE_TYPE, CHANGE_SEQUENCE_NUMBER, corrupt, *marked]],
    )


def check(connector: str | None, topics: list[str] | None, topic_pattern: str | None) -> None:
    """Refuse what :func:`debezium_kafka` cannot read, before a session is needed."""
    if connector not in CONNECTORS:
        raise UnknownConnectorError(connector=connector, connectors=list(CONNECTORS))
    if (topics is None) == (topic_pattern is None):
        raise DebeziumTopicsError(topics=topics, pattern=topic_pattern)


def debezium_kafka(
    spark: SparkSession,
    *,
    bootstrap_servers: str,
    connector: Connector,
    row_schema: str | StructType | None = None,
    topics: list[str] | None = None,
    topic_pattern: str | None = None,
    table: str | None = None,
    options: dict[str, str] | None = None,
    transaction_id: str | None = None,
) -> DataFrame:
    """A Debezium connector's Kafka topics as a stream of change rows (see
    :func:`debezium_changes`): ``topics`` by name or ``topic_pattern`` (a Java regex), read
    from the earliest offset by default, so a new mirror starts with the connector's
    snapshot. ``options`` are Spark's Kafka source options (``kafka.*`` for the client,
    ``startingOffsets``, ``maxOffsetsPerTrigger``, ...), a secret among them given as
    ``${env:NAME}`` or ``${file:PATH}`` (resolved now, and never recorded: see
    :mod:`autocdc.sources.kafkaclient`); ``transaction_id`` names a column
    for each change's transaction id. The streaming query's checkpoint
    keeps the offsets; the flow absorbs what Kafka delivers again after a crash.

    >>> changes = debezium_kafka(spark, bootstrap_servers="broker:9092",
    ...     topics=["shop.public.customers"], row_schema="id INT, name STRING",
    ...     connector="postgresql")  # doctest: +SKIP
    """
    check(connector, topics, topic_pattern)
    # Secrets are resolved now (an unset variable is refused before anything is read);
    # Spark's reader gets them, the plan's record only their placeholders.
    given = kafkaclient.resolved(options)
    try:
        client: dict[str, str] | None = kafkaclient.config(given)
        not_askable = None
    except kafkaclient.NotAskable as why:
        client, not_askable = None, str(why)
    if client is not None:
        kafkabroker.check_topics(bootstrap_servers, topics, client)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("startingOffsets", "earliest")
    )
    if topics is not None:
        reader = reader.option("subscribe", ",".join(topics))
    else:
        reader = reader.option("subscribePattern", topic_pattern)
    for key, value in given.items():
        reader = reader.option(key, value)
    record = kafkaclient.record_option(options)
    if record is not None:
        reader = reader.option(kafkaclient.RECORD_OPTION, record)
    row, new_columns = row_schema, "ignore"  # declared: the columns taken
    if row is None:
        named = f"topics {topics}" if topics else f"the topics matching {topic_pattern!r}"
        if client is None:
            raise DebeziumSchemaError(
                topics=named,
                problem="autocdc reads the events' schemas with a client of its own, which "
                f"cannot take the broker's security settings: {not_askable}",
            )
        sample = kafkabroker.newest(bootstrap_servers, topics, topic_pattern, SCHEMA_SAMPLE, client)
        row, new_columns = row_schema_of(sample, connector, table, named), "fail"
    return debezium_changes(
        reader.load(),
        row,
        connector,
        table=table,
        transaction_id=transaction_id,
        new_columns=new_columns,
        mark_tombstones=True,  # counted as the flow's skipped rows
    )
