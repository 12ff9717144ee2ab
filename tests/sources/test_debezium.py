"""Debezium change events as change rows: the envelope mapped, positions in commit order,
tombstones skipped, and events that cannot be mapped quarantined with their raw text.

The event files in tests/sources/data/debezium hold one event value per line (a blank line is a
Kafka tombstone); the last lines of each ``-1`` file are the malformed events.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from frames import assert_rows
from processes import ROOT
from projects import run

import autocdc
from autocdc.engine.errors import QUARANTINE_MALFORMED_RECORD
from autocdc.runtime import raised_in_worker
from autocdc.sources.debezium_schema import row_schema_of, spark_type
from autocdc.sources.errors import (
    DebeziumSchemaChangedError,
    DebeziumSchemaError,
    DebeziumTopicsError,
    KafkaUnreachableError,
)

DATA = Path(__file__).parent / "data" / "debezium"
EXAMPLE = ROOT / "pipelines" / "debezium"
ROW = "id INT, name STRING, city STRING"
OUT_EXTRA = ["_CHANGE_TYPE", "_CHANGE_SEQUENCE_NUMBER", "_corrupt_record"]
OUT = f"{ROW}, _CHANGE_TYPE STRING, _CHANGE_SEQUENCE_NUMBER STRING, _corrupt_record STRING"
BAD_PG, BAD_MYSQL = 6, 4  # malformed events at the end of postgres-1 and mysql-1


def lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def kafka_values(spark, name: str):
    """The file as Kafka would deliver it: binary values, a tombstone as a NULL value."""
    values = [(line.encode() if line else None,) for line in lines(name)]
    return spark.createDataFrame(values, "value binary")


def cdc_flow(target: str) -> autocdc.AutoCdcFlow:
    return autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by=autocdc.hex_sequence("_CHANGE_SEQUENCE_NUMBER"),
        apply_as_deletes="_CHANGE_TYPE = 'DELETE'",
        apply_as_truncates="_CHANGE_TYPE = 'TRUNCATE'",
        except_column_list=["_CHANGE_TYPE", "_CHANGE_SEQUENCE_NUMBER"],
    )


def quarantined(spark, flow) -> list[tuple[str, str]]:
    rows = spark.table(flow.quarantine_table).collect()
    return sorted((r.reason, json.loads(r.row)["_corrupt_record"]) for r in rows)


def pg(rank: int, last_commit: int | None, lsn: int) -> str:
    return f"{rank}/{max(last_commit or 0, lsn):X}/{lsn:X}"


def test_postgres_events_map_to_change_rows_in_commit_order(spark):
    """Every field of the mapping: image, change type, position (snapshot reads first,
    then commit order), the schema/payload wrapper, tombstones, and the raw text of
    each event that cannot be mapped."""
    changes = autocdc.debezium_changes(
        spark.read.text(str(DATA / "postgres-1.jsonl")), ROW, "postgresql"
    )
    up, snap = "UPSERT", 0
    expected = [
        (1, "Ann", "Oslo", up, pg(snap, None, 24023128), None),
        (2, "Bob", "Rome", up, pg(snap, None, 24023128), None),
        (3, "Cid", "Kyiv", up, pg(snap, None, 24023128), None),
        (1, "Anna", "Oslo", up, pg(1, None, 24022936), None),
        (2, "Bob", "Milan", up, pg(1, 24023400, 24023600), None),
        (4, "Dan", "Lima", up, pg(1, 24023776, 24023512), None),
        (3, None, None, "DELETE", pg(1, 24023776, 24023688), None),
        (4, "Dan", "Quito", up, pg(1, 24024100, 24024300), None),
        (4, "Dan", "Cusco", up, pg(1, 24023864, 24024000), None),  # schema/payload wrapper
        (4, "Dan", "Quito", up, pg(1, 24024100, 24024300), None),
    ]
    bad = lines("postgres-1.jsonl")[-BAD_PG:]
    actual = changes.where("_corrupt_record IS NULL")
    assert_rows(spark, actual, expected, OUT)
    raw = [r._corrupt_record for r in changes.where("_corrupt_record IS NOT NULL").collect()]
    assert sorted(raw) == sorted(bad)

    # Commit order: tx 772 committed before tx 771 although 771 wrote a lower LSN first.
    order = sorted(expected, key=lambda r: autocdc.parse_hex_sequence(r[4]))
    assert [(r[0], r[1], r[2]) for r in order][3:6] == [
        (1, "Anna", "Oslo"),
        (2, "Bob", "Milan"),
        (4, "Dan", "Lima"),
    ]


def test_postgres_feed_applies_like_the_database(spark, new_table):
    """Kafka-style values: the snapshot, a transaction that committed after the snapshot
    with a lower LSN, interleaved transactions, redelivery and out-of-order delivery;
    then a truncate that also removes a late duplicate from before it."""
    flow = cdc_flow(new_table("dbz_pg"))
    metrics = flow.apply(
        autocdc.debezium_changes(kafka_values(spark, "postgres-1.jsonl"), ROW, "postgresql")
    )
    assert_rows(
        spark,
        flow.current(spark),
        [(1, "Anna", "Oslo"), (2, "Bob", "Milan"), (4, "Dan", "Quito")],
        ROW,
    )
    assert metrics.quarantined == BAD_PG
    bad = lines("postgres-1.jsonl")[-BAD_PG:]
    assert quarantined(spark, flow) == sorted((QUARANTINE_MALFORMED_RECORD, b) for b in bad)

    flow.apply(autocdc.debezium_changes(kafka_values(spark, "postgres-2.jsonl"), ROW, "postgresql"))
    assert_rows(spark, flow.current(spark), [(5, "Eve", "Oslo")], ROW)


def test_mysql_feed_applies_in_binlog_order(spark, new_table):
    """Snapshot, a multi-row event (same pos, rows 0 and 1), a delete and its tombstone,
    and a binlog roll-over from .999999 to .1000000 delivered newest first, twice (into
    SCD2, with its history: test_example_pipeline)."""
    flow = cdc_flow(new_table("dbz_mysql"))
    events = spark.read.text(str(DATA / "mysql-1.jsonl"))
    metrics = flow.apply(autocdc.debezium_changes(events, ROW, "mysql"))
    expected = [(1, "Anna", "Oslo"), (3, "Cid", "Riga"), (4, "Dan", "Lima")]
    assert_rows(spark, flow.current(spark).select("id", "name", "city"), expected, ROW)
    assert metrics.quarantined == BAD_MYSQL
    bad = lines("mysql-1.jsonl")[-BAD_MYSQL:]
    assert quarantined(spark, flow) == sorted((QUARANTINE_MALFORMED_RECORD, b) for b in bad)


def test_streaming_events_and_the_sequence_helper(spark, tmp_path):
    """The helper is lazy (a streaming source maps without running), and
    debezium_sequence orders parsed events exactly like _CHANGE_SEQUENCE_NUMBER."""
    stream = autocdc.debezium_changes(spark.readStream.text(str(DATA)), ROW, "mysql")
    assert stream.isStreaming
    assert stream.columns == [
        "id",
        "name",
        "city",
        "_CHANGE_TYPE",
        "_CHANGE_SEQUENCE_NUMBER",
        "_corrupt_record",
    ]

    source = "file STRING, pos BIGINT, row INT, snapshot STRING"
    parsed = spark.createDataFrame(
        [(("mysql-bin.1000000", 157, 0, None),), (("mysql-bin.999999", 4567, 1, "false"),)],
        f"source struct<{source}>",
    )
    sequences = parsed.select(autocdc.debezium_sequence("mysql").alias("s")).collect()
    assert [tuple(r.s) for r in sequences] == [(1, 1_000_000, 157, 0), (1, 999999, 4567, 1)]


def test_unknown_connector_is_refused_before_spark():
    with pytest.raises(autocdc.UnknownConnectorError) as err:
        autocdc.debezium_sequence("oracle")  # type: ignore[arg-type]
    assert err.value.params["connector"] == "oracle"


def test_old_style_tombstones_are_skipped_and_a_topics_other_tables_left_out(spark):
    """``{"schema": null, "payload": null}`` (a delete's tombstone under the JSON converter
    with schemas) is no change, not a malformed event; ``table`` keeps one table of a
    topic that carries several, and an event naming no table stays, to be quarantined."""

    def event(table: str, id_: int) -> str:
        source = {"schema": "public", "table": table, "sequence": '[null, "100"]', "lsn": 100}
        after = {"id": id_, "name": "n", "city": "c"}
        return json.dumps({"op": "c", "before": None, "after": after, "source": source})

    values = [
        event("customers", 1),
        '{"schema": null, "payload": null}',
        '{"schema":null,"payload":null}',
        event("orders", 2),
        '{"op": "c", "after": {"id": 3}}',  # no source: which table cannot be told
    ]
    events = spark.createDataFrame([(v,) for v in values], "value string")
    every = autocdc.debezium_changes(events, ROW, "postgresql")
    assert [r.id for r in every.where("_corrupt_record IS NULL").orderBy("id").collect()] == [1, 2]
    assert every.count() == 3  # both tombstones skipped
    mine = autocdc.debezium_changes(events, ROW, "postgresql", table="public.customers")
    assert sorted((r.id, r._corrupt_record is None) for r in mine.collect()) == [
        (1, True),
        (3, False),
    ]


def test_the_transaction_id_is_added_when_asked(spark):
    """Debezium's transaction metadata first, else the connector's own id in ``source``;
    a column only when named (its name may need quoting)."""

    def event(source: dict, transaction: dict | None = None) -> str:
        after = {"id": 1, "name": "n", "city": "c"}
        envelope = {"op": "c", "after": after, "source": source, "transaction": transaction}
        return json.dumps(envelope)

    pg = {"sequence": '[null, "100"]', "lsn": 100}
    mysql = {"file": "mysql-bin.000003", "pos": 7}
    values = [
        ("postgresql", event({**pg, "txId": 771})),
        ("postgresql", event({**pg, "txId": 771}, {"id": "771:100", "total_order": 1})),
        ("mysql", event({**mysql, "gtid": "0-1-42"})),
        ("mysql", event(mysql)),
    ]
    found = []
    for connector, value in values:
        events = spark.createDataFrame([(value,)], "value string")
        changes = autocdc.debezium_changes(events, ROW, connector, transaction_id="tx.id")
        found.append(changes.select("`tx.id`", "_corrupt_record").first())
    assert [tuple(r) for r in found] == [
        ("771", None),
        ("771:100", None),
        ("0-1-42", None),
        (None, None),
    ]
    plain = autocdc.debezium_changes(events, ROW, "mysql")
    assert plain.columns == ["id", "name", "city", *OUT_EXTRA]


@pytest.mark.parametrize("auto", [True, False])
def test_marked_tombstones_are_counted_as_skipped_never_applied_or_quarantined(
    spark, new_table, auto
):
    """Kafka tombstones (NULL), old-style ones and blank values, kept as rows marked for
    the flow: counted as ``skipped``, not in ``rows_in``, not quarantined, not stored;
    with a ``sequence_by`` flow as without (the auto mode)."""
    values = [
        connect_value({"id": 1, "name": "a", "city": "c"}),
        None,
        '{"schema": null, "payload": null}',
        "  ",
        connect_value({"id": 2, "name": "b", "city": "d"}, op="u", lsn=200),
        "not json",
    ]
    events = spark.createDataFrame([(v,) for v in values], "value string")
    changes = autocdc.debezium_changes(events, ROW, "postgresql", mark_tombstones=True)
    target = new_table("dbz_skip")
    flow = autocdc.AutoCdcFlow(target=target, keys=["id"]) if auto else cdc_flow(target)
    metrics = flow.apply(changes)
    assert (metrics.rows_in, metrics.skipped, metrics.quarantined) == (3, 3, 1)
    assert_rows(spark, flow.current(spark).orderBy("id"), [(1, "a", "c"), (2, "b", "d")], ROW)
    assert spark.table(f"{target}__autocdc_quarantine").count() == 1
    assert autocdc.debezium_changes(events, ROW, "postgresql").count() == 3  # left out


def test_a_broker_that_does_not_answer_is_named_unless_not_askable(spark):
    """Nothing listens at port 9: the source says so when built. A broker secured in a way
    autocdc's own client cannot take (Kerberos, Kafka's default SASL mechanism) is not
    asked, so its source is built lazily as before, but its row schema cannot be taken
    from its events."""
    source = {"bootstrap_servers": "127.0.0.1:9", "connector": "postgresql", "topics": ["t"]}
    with pytest.raises(KafkaUnreachableError, match=r"No Kafka broker answered at 127\.0\.0\.1:9 "):
        autocdc.debezium_kafka(spark, row_schema=ROW, **source)
    secured = {"kafka.security.protocol": "SASL_SSL"}
    assert autocdc.debezium_kafka(spark, row_schema=ROW, options=secured, **source).isStreaming
    with pytest.raises(DebeziumSchemaError, match="cannot take the broker's security settings"):
        autocdc.debezium_kafka(spark, options=secured, **source)


@pytest.mark.parametrize("topics", [{}, {"topics": ["a"], "topic_pattern": "a.*"}])
def test_a_kafka_source_reads_topics_or_a_pattern_exactly_one(spark, topics):
    with pytest.raises(DebeziumTopicsError) as err:
        autocdc.debezium_kafka(
            spark, bootstrap_servers="127.0.0.1:9", row_schema=ROW, connector="postgresql", **topics
        )
    assert err.value.error_class == "AUTOCDC_DEBEZIUM_TOPICS"


def test_example_pipeline(spark, tmp_path, new_table, monkeypatch):
    """pipelines/debezium, run in a copy with its own database, ends as check.py says."""
    root = tmp_path / "debezium"
    shutil.copytree(
        EXAMPLE, root, ignore=shutil.ignore_patterns("storage", "warehouse", "autocdc-*")
    )
    database = new_table("dbz_example")
    spec = root / "spark-pipeline.yml"
    spec.write_text(spec.read_text() + f"database: {database}\n")
    monkeypatch.chdir(root)
    run(spark, spec)

    loader = importlib.util.spec_from_file_location("debezium_check", root / "check.py")
    check = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(check)
    spark.catalog.setCurrentDatabase(database)
    try:
        assert check.check(spark)
    finally:
        spark.catalog.setCurrentDatabase("default")


def connect_value(row: dict, table: str = "customers", op: str = "c", lsn: int = 100) -> str:
    """An event as Kafka Connect's JSON converter writes it: the envelope's schema (the
    row's Connect types, as Debezium declares them) and the payload."""
    types = {bool: "boolean", int: "int64", float: "float64", str: "string"}
    fields = [{"type": types[type(v)], "optional": k != "id", "field": k} for k, v in row.items()]
    image = {"type": "struct", "fields": fields, "optional": True, "name": "Value"}
    source = {"schema": "public", "table": table, "sequence": f'[null, "{lsn}"]', "lsn": lsn}
    schema = {
        "type": "struct",
        "fields": [
            {**image, "field": "before"},
            {**image, "field": "after"},
            {"type": "struct", "fields": [], "optional": False, "field": "source"},
            {"type": "string", "optional": False, "field": "op"},
        ],
    }
    payload = {"before": None, "after": row, "source": source, "op": op}
    return json.dumps({"schema": schema, "payload": payload})


def test_the_row_schema_is_taken_from_the_events(spark):
    """The union of the events' row schemas in the newest's order: a column added is taken,
    one dropped kept; other tables, tombstones and events without a schema are passed
    over; none left is an error that says to declare the schema."""
    values = [
        connect_value({"id": 1, "name": "a", "gone": True}),
        None,
        '{"schema": null, "payload": null}',
        json.dumps({"op": "c", "after": {"id": 9}}),  # no schema (schemas.enable=false)
        connect_value({"id": 1, "x": 1.5}, table="orders"),
        connect_value({"id": 2, "name": "b", "score": 2.5}),
    ]
    found = row_schema_of(values, "postgresql", "public.customers", "topics ['t']")
    assert found.simpleString() == "struct<id:bigint,name:string,score:double,gone:boolean>"
    with pytest.raises(DebeziumSchemaError) as err:
        row_schema_of(values[1:4], "postgresql", None, "topics ['t']")
    assert "none of their newest events carries a schema" in str(err.value)
    with pytest.raises(DebeziumSchemaError, match="they hold no events yet"):
        row_schema_of([None], "postgresql", None, "topics ['t']")
    nested = {"type": "array", "items": {"type": "map", "keys": {"type": "string"},
                                         "values": {"type": "int32"}}}  # fmt: skip
    assert spark_type(nested).simpleString() == "array<map<string,int>>"


def test_an_event_with_a_new_column_fails_the_query_when_asked(spark):
    """With ``new_columns="fail"`` (a schema taken from the events), an event with a column
    the schema lacks stops the batch with its own error; by default it is ignored."""
    values = [
        connect_value({"id": 1, "name": "a"}),
        connect_value({"id": 2, "name": "b", "e": "x"}),
    ]
    events = spark.createDataFrame([(v,) for v in values], "value string")
    assert autocdc.debezium_changes(events, "id BIGINT, name STRING", "postgresql").count() == 2
    strict = autocdc.debezium_changes(
        events, "id BIGINT, name STRING", "postgresql", new_columns="fail"
    )
    with pytest.raises(Exception) as err:
        strict.collect()
    rebuilt = raised_in_worker(err.value)
    assert isinstance(rebuilt, DebeziumSchemaChangedError)
    assert rebuilt.params == {"table": "the topics", "columns": "e"}  # read back from the text
    assert "columns the source's schema does not have (e; the schema" in str(rebuilt)
