"""The pipeline SQL parser: statement structure parsed, queries and expressions kept verbatim."""

from __future__ import annotations

import dataclasses
import inspect
from decimal import Decimal
from typing import Any

import pytest

from autocdc import pipelines as dp
from autocdc.engine.spec import FlowDefinition
from autocdc.pipelines.declare import sql
from autocdc.pipelines.declare.sql import (
    AutoCdcSnapshotStatement,
    AutoCdcStatement,
    CreateDataset,
    DebeziumStatement,
    ExtractionStatement,
    InsertFlow,
    Location,
    PipelineSqlSyntaxError,
    SetConf,
    parse,
)

DOCS_EXAMPLE = """\
CREATE OR REFRESH STREAMING TABLE customers;
CREATE FLOW customers_cdc AS AUTO CDC INTO customers
FROM STREAM(customers_raw)
KEYS (id)
APPLY AS DELETE WHEN operation = 'DELETE'
SEQUENCE BY sequenceNum
COLUMNS * EXCEPT (operation, sequenceNum)
STORED AS SCD TYPE 2
TRACK HISTORY ON * EXCEPT (city);
"""


def one(text: str) -> Any:
    (statement,) = parse(text, "p.sql")
    return statement


def cdc(clauses: str) -> AutoCdcStatement:
    statement = one(f"AUTO CDC INTO t FROM s KEYS (id) {clauses}")
    assert isinstance(statement, AutoCdcStatement)
    return statement


def error(text: str) -> PipelineSqlSyntaxError:
    with pytest.raises(PipelineSqlSyntaxError) as caught:
        parse(text, "p.sql")
    return caught.value


def test_docs_example() -> None:
    table, flow = parse(DOCS_EXAMPLE, "p.sql")
    assert table == CreateDataset(
        kind="streaming_table",
        name="customers",
        query=None,
        schema=None,
        comment=None,
        properties={},
        partition_cols=None,
        cluster_by=None,
        format=None,
        location=Location("p.sql", 1, 1),
    )
    assert flow == AutoCdcStatement(
        name="customers_cdc",
        target="customers",
        source="customers_raw",
        streaming=True,
        keys=["id"],
        sequence_by="sequenceNum",
        apply_as_deletes="operation = 'DELETE'",
        apply_as_truncates=None,
        column_list=None,
        except_column_list=["operation", "sequenceNum"],
        stored_as_scd_type=2,
        track_history_column_list=None,
        track_history_except_column_list=["city"],
        ignore_null_updates=False,
        location=Location("p.sql", 2, 1),
    )


def test_streaming_table_with_every_clause() -> None:
    table = one(
        "CREATE STREAMING TABLE raw (id INT NOT NULL, CONSTRAINT ok EXPECT (id > 0)) "
        "COMMENT 'Raw rows' PARTITIONED BY (day, `region id`) "
        "TBLPROPERTIES ('quality' = 'bronze', delta.appendOnly = true, 'n' 1) USING delta "
        "AS SELECT * FROM STREAM read_files('/data')"
    )
    assert table.schema == "id INT NOT NULL, CONSTRAINT ok EXPECT (id > 0)"
    assert table.comment == "Raw rows"
    assert table.partition_cols == ["day", "region id"]
    assert table.properties == {"quality": "bronze", "delta.appendOnly": "true", "n": "1"}
    assert table.format == "delta"
    assert table.query == "SELECT * FROM STREAM read_files('/data')"


def test_table_clauses_in_any_order() -> None:
    table = one("CREATE MATERIALIZED VIEW mv USING delta CLUSTER BY (a, b) COMMENT 'c' AS SELECT 1")
    assert (table.kind, table.cluster_by, table.comment, table.format) == (
        "materialized_view",
        ["a", "b"],
        "c",
        "delta",
    )


def test_materialized_view() -> None:
    view = one("CREATE OR REFRESH MATERIALIZED VIEW sales.daily AS SELECT day, sum(x) FROM t")
    assert (view.kind, view.name, view.query) == (
        "materialized_view",
        "sales.daily",
        "SELECT day, sum(x) FROM t",
    )


@pytest.mark.parametrize("create", ["CREATE", "CREATE OR REFRESH", "CREATE OR REPLACE"])
def test_temporary_view(create: str) -> None:
    view = one(f"{create} TEMPORARY VIEW v COMMENT 'tmp' AS SELECT * FROM src")
    assert (view.kind, view.name, view.comment, view.query) == (
        "temporary_view",
        "v",
        "tmp",
        "SELECT * FROM src",
    )


def test_insert_flow() -> None:
    flow = one("CREATE FLOW backfill COMMENT 'once' AS INSERT INTO db.t BY NAME SELECT * FROM old")
    assert flow == InsertFlow(
        "backfill", "db.t", "SELECT * FROM old", "once", Location("p.sql", 1, 1)
    )


def test_insert_flow_query_may_start_with_a_keyword_like_word() -> None:
    assert one("CREATE FLOW f AS INSERT INTO t FROM STREAM(s) SELECT *").query == (
        "FROM STREAM(s) SELECT *"
    )


def test_apply_changes_spelling_and_bare_statement_name_the_flow_after_the_target() -> None:
    flow = one("APPLY CHANGES INTO cat.db.customers FROM STREAM cdc KEYS (id) SEQUENCE BY ts")
    assert (flow.name, flow.target, flow.source, flow.streaming) == (
        "cat.db.customers",
        "cat.db.customers",
        "cdc",
        True,
    )
    assert one("CREATE FLOW f AS APPLY CHANGES INTO t FROM s KEYS (k) SEQUENCE BY v").name == "f"


@pytest.mark.parametrize(
    ("source", "name", "streaming"),
    [
        ("STREAM(raw)", "raw", True),
        ("stream(cat.db.raw)", "cat.db.raw", True),
        ("STREAM raw", "raw", True),
        ("raw", "raw", False),
        ("stream_raw", "stream_raw", False),
        ("`my src`", "`my src`", False),
    ],
)
def test_source_forms(source: str, name: str, streaming: bool) -> None:
    flow = one(f"AUTO CDC INTO t FROM {source} KEYS (id) SEQUENCE BY ts")
    assert (flow.source, flow.streaming) == (name, streaming)


def test_snapshot_flow() -> None:
    flow = one(
        "CREATE FLOW daily AS AUTO CDC INTO db.customers FROM SNAPSHOT db.export "
        "KEYS (id, `re gion`) STORED AS SCD TYPE 2 TRACK HISTORY ON * EXCEPT (email)"
    )
    assert flow == AutoCdcSnapshotStatement(
        name="daily",
        target="db.customers",
        source="db.export",
        keys=["id", "re gion"],
        stored_as_scd_type=2,
        track_history_column_list=None,
        track_history_except_column_list=["email"],
        location=Location("p.sql", 1, 1),
    )


def test_snapshot_flow_defaults_and_clauses_in_any_order() -> None:
    flow = one("apply changes into t from snapshot s keys (k)")
    assert (flow.name, flow.source, flow.stored_as_scd_type) == ("t", "s", 1)
    flow = one(
        "AUTO CDC INTO t FROM SNAPSHOT s KEYS (k) TRACK HISTORY ON a, b STORED AS SCD TYPE 2"
    )
    assert (flow.track_history_column_list, flow.stored_as_scd_type) == (["a", "b"], 2)


@pytest.mark.parametrize("clause", ["APPLY AS DELETE WHEN op = 'D'", "COLUMNS a"])
def test_snapshot_flow_refuses_change_feed_clauses(clause: str) -> None:
    """SEQUENCE BY is the one it takes: its position on the change flows' clock."""
    err = error(f"AUTO CDC INTO t FROM SNAPSHOT s KEYS (k) {clause}")
    assert err.params["column"] == 42
    assert err.params["expected"] == (
        "one of: SEQUENCE BY, STORED AS SCD TYPE, TRACK HISTORY ON, `;`, end of input"
    )


@pytest.mark.parametrize(
    ("selection", "listed", "excepted"),
    [
        ("a, b", ["a", "b"], None),
        ("(a, `b c`)", ["a", "b c"], None),
        ("* EXCEPT (a, b)", None, ["a", "b"]),
        ("*", None, None),
    ],
)
def test_column_selections(
    selection: str, listed: list[str] | None, excepted: list[str] | None
) -> None:
    flow = cdc(
        f"SEQUENCE BY ts COLUMNS {selection} STORED AS SCD TYPE 2 TRACK HISTORY ON {selection}"
    )
    assert (flow.column_list, flow.except_column_list) == (listed, excepted)
    assert (flow.track_history_column_list, flow.track_history_except_column_list) == (
        listed,
        excepted,
    )


@pytest.mark.parametrize(
    "clauses",
    [
        "IGNORE NULL UPDATES APPLY AS DELETE WHEN op = 'D' SEQUENCE BY ts",
        "SEQUENCE BY ts APPLY AS DELETE WHEN op = 'D' IGNORE NULL UPDATES",
        "APPLY AS DELETE WHEN op = 'D' SEQUENCE BY ts IGNORE NULL UPDATES",
    ],
)
def test_ignore_nulls_and_deletes_before_or_after_sequence_by(clauses: str) -> None:
    flow = cdc(clauses)
    assert (flow.ignore_null_updates, flow.apply_as_deletes, flow.sequence_by) == (
        True,
        "op = 'D'",
        "ts",
    )


def test_defaults_and_truncates() -> None:
    flow = cdc("APPLY AS TRUNCATE WHEN op = 'T' SEQUENCE BY ts STORED AS SCD TYPE 1")
    assert (flow.apply_as_truncates, flow.stored_as_scd_type, flow.ignore_null_updates) == (
        "op = 'T'",
        1,
        False,
    )
    assert cdc("SEQUENCE BY ts").stored_as_scd_type == 1


def test_upserts_declared_as_a_condition() -> None:
    flow = cdc("APPLY AS DELETE WHEN op = 'D' APPLY AS UPSERT WHEN op IN ('I', 'U') SEQUENCE BY ts")
    assert (flow.apply_as_deletes, flow.apply_as_upserts) == ("op = 'D'", "op IN ('I', 'U')")


def test_expressions_are_exact_source_slices() -> None:
    flow = cdc(
        "APPLY AS DELETE WHEN op = 'D' AND x IN ('a;b', \"c)\")\n"
        "SEQUENCE BY struct(ts, /* tie-break */ lsn)  -- trailing\n"
        "COLUMNS a"
    )
    assert flow.apply_as_deletes == "op = 'D' AND x IN ('a;b', \"c)\")"
    assert flow.sequence_by == "struct(ts, /* tie-break */ lsn)"


def test_words_are_keywords_only_where_a_keyword_may_follow() -> None:
    view = one("CREATE MATERIALIZED VIEW keys AS SELECT keys, count(*) sequence FROM columns")
    assert (view.name, view.query) == ("keys", "SELECT keys, count(*) sequence FROM columns")
    assert cdc("SEQUENCE BY coalesce(sequence, columns) COLUMNS a").sequence_by == (
        "coalesce(sequence, columns)"
    )


def test_keywords_are_case_insensitive() -> None:
    flow = one("create flow f as auto cdc into t from stream(s) keys (id) sequence by ts")
    assert (flow.name, flow.keys, flow.sequence_by) == ("f", ["id"], "ts")


@pytest.mark.parametrize(
    ("written", "name"),
    [
        ("db.t", "db.t"),
        ("`my table`", "`my table`"),
        ("cat.`db`.`t`", "cat.db.t"),
        ("`a.b`.c", "`a.b`.c"),
        ("`x``y`", "`x``y`"),
    ],
)
def test_names(written: str, name: str) -> None:
    assert one(f"CREATE STREAMING TABLE {written}").name == name


def test_key_columns_are_unquoted() -> None:
    assert cdc("SEQUENCE BY ts").keys == ["id"]
    assert one("AUTO CDC INTO t FROM s KEYS (`order id`, b) SEQUENCE BY ts").keys == [
        "order id",
        "b",
    ]


def test_semicolons_in_strings_backticks_and_comments_do_not_split() -> None:
    first, second = parse(
        "CREATE TEMPORARY VIEW v AS SELECT ';' AS `a;b` -- ; not here\n"
        "/* ; nor here */ FROM t;\n"
        "SET a = 'x;y'",
        "p.sql",
    )
    assert first.query == "SELECT ';' AS `a;b` -- ; not here\n/* ; nor here */ FROM t"
    assert second.value == "x;y"


@pytest.mark.parametrize("text", ["", "  \n", ";;", "-- only a comment\n/* and this */ ;"])
def test_empty_statements_are_ignored(text: str) -> None:
    assert parse(text, "p.sql") == []


def test_locations_point_at_each_statements_first_token() -> None:
    text = "-- header\n\n  SET a = 1;  CREATE STREAMING TABLE t\r\nAS\r\n  SELECT 1;\n\tSET b=2"
    assert [s.location for s in parse(text, "dir/p.sql")] == [
        Location("dir/p.sql", 3, 3),
        Location("dir/p.sql", 3, 15),
        Location("dir/p.sql", 6, 2),
    ]


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        ("SET spark.sql.shuffle.partitions = 4", "spark.sql.shuffle.partitions", "4"),
        ("SET pipelines.trigger.interval = '1 hour'", "pipelines.trigger.interval", "1 hour"),
        ('SET `my.key` = "it\'s"', "my.key", "it's"),
        ("SET my-app.start = a=b", "my-app.start", "a=b"),
    ],
)
def test_set(text: str, key: str, value: str) -> None:
    assert one(text) == SetConf(key, value, Location("p.sql", 1, 1))


def test_string_escapes_are_undone() -> None:
    assert one(r"CREATE STREAMING TABLE t COMMENT 'it''s a \'test\'\n'").comment == (
        "it's a 'test'\n"
    )


def test_extraction_source_with_every_clause() -> None:
    """What ``dp.create_extraction_source`` takes, as clauses in any order: ORDER BY is its
    cdc_order (names quoted for the database), WHERE and PARTITIONS go to the database as
    written, CONNECTION ENV names the variable holding the connection string."""
    source = one(
        "CREATE EXTRACTION SOURCE shop.items_src FROM public.items\n"
        "  CONNECTION ENV 'SHOP_DSN'\n"
        "  ORDER BY updated_at, `ver sion` desc\n"
        "  WHERE region <> 'test' AND id % 2 = 0\n"
        "  PARTITIONS ('id < 100', 'id >= 100')\n"
        "  LOOKBACK '30 seconds' LIMIT 1000\n"
        "  COLUMNS (id BIGINT, name STRING)\n"
        "  OPTIONS (max_concurrency = 2, staging = true, retries = '3')"
    )
    assert source == ExtractionStatement(
        name="shop.items_src",
        table="public.items",
        dsn=None,
        dsn_env="SHOP_DSN",
        options={
            "cdc_order": ['"updated_at"', '"ver sion" desc'],
            "where": "region <> 'test' AND id % 2 = 0",
            "partitions": ["id < 100", "id >= 100"],
            "lookback": "30 seconds",
            "limit": 1000,
            "columns": "id BIGINT, name STRING",
            "options": {"max_concurrency": 2, "staging": True, "retries": 3},
        },
        location=Location("p.sql", 1, 1),
    )
    stateless = one("CREATE EXTRACTION SOURCE s FROM t STRATEGY STATELESS CONNECTION 'host=db'")
    assert (stateless.dsn, stateless.options) == ("host=db", {"strategy": "STATELESS"})
    assert one("CREATE EXTRACTION SOURCE s FROM t CONNECTION 'x' LOOKBACK 2.5").options == {
        "lookback": Decimal("2.5")
    }
    jdbc = one(
        "CREATE EXTRACTION SOURCE s FROM t STRATEGY STATELESS CONNECTION 'jdbc:mariadb://db/x' "
        "OPTIONS (user = 'r', password_env = 'P', partition_column = 'id', num_partitions = 4, "
        "retries = 2)"
    )
    assert (jdbc.dsn, jdbc.options) == (
        "jdbc:mariadb://db/x",
        {
            "strategy": "STATELESS",
            "user": "r",
            "password_env": "P",
            "partition_column": "id",
            "num_partitions": 4,
            "options": {"retries": 2},
        },
    )


def test_unsupported_statement_names_the_supported_ones() -> None:
    err = error("SET a = 1;\n\nDROP TABLE x;")
    assert err.error_class == "AUTOCDC_PIPELINE_SQL_SYNTAX"
    assert (err.params["file"], err.params["line"], err.params["column"]) == ("p.sql", 3, 1)
    assert "CREATE" in err.params["expected"]
    assert "STREAMING TABLE" in err.params["hint"]


def test_unknown_create_lists_what_may_be_created() -> None:
    err = error("CREATE TABLE x AS SELECT 1")
    assert (err.params["line"], err.params["column"]) == (1, 8)
    assert "STREAMING TABLE, MATERIALIZED VIEW, TEMPORARY VIEW, FLOW" in err.params["expected"]


def test_misspelled_keyword_is_reported_as_a_whole_word() -> None:
    err = error("CREATE STREAMINGS TABLE t")
    assert "STREAMINGS" in err.params["problem"]
    assert err.params["column"] == 8


def test_missing_keys() -> None:
    err = error("CREATE OR REFRESH STREAMING TABLE t;\nAUTO CDC INTO t FROM s\n  SEQUENCE BY ts")
    assert (err.params["line"], err.params["column"]) == (3, 3)
    assert err.params["expected"] == "one of: KEYS, `.`"


def test_sequence_by_is_optional() -> None:
    """No SEQUENCE BY: the source's BigQuery-style change columns order the changes."""
    flow = one("AUTO CDC INTO t FROM s KEYS (id) COLUMNS a")
    assert (flow.sequence_by, flow.column_list) == (None, ["a"])


def test_clause_given_twice() -> None:
    err = error("AUTO CDC INTO t FROM s KEYS (id)\nSEQUENCE BY a\nSEQUENCE BY b")
    assert (err.params["line"], err.params["column"]) == (3, 1)
    assert "SEQUENCE BY" in err.params["problem"]
    assert "COMMENT" in error("CREATE STREAMING TABLE t COMMENT 'a' COMMENT 'b'").params["problem"]


def test_scd_type_3_is_rejected() -> None:
    err = error("AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY ts STORED AS SCD TYPE 3")
    assert (err.params["line"], err.params["column"]) == (1, 68)
    assert "SCD TYPE 2" in err.params["expected"]


def test_or_replace_is_only_for_temporary_views() -> None:
    err = error("CREATE OR REPLACE STREAMING TABLE t")
    assert (err.params["column"], err.params["expected"]) == (19, "TEMPORARY VIEW")


def test_materialized_view_needs_a_query() -> None:
    err = error("CREATE MATERIALIZED VIEW v;")
    assert err.params["column"] == 27
    assert "AS" in err.params["expected"]


def test_a_bad_clause_lists_the_clauses_that_may_follow() -> None:
    err = error("AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY ts COLUMNS a b")
    assert err.params["column"] == 59
    assert "TRACK HISTORY ON" in err.params["expected"]


def test_debezium_source() -> None:
    """``autocdc.debezium_kafka``'s arguments as clauses; Spark's options kept as text."""
    source = one(
        "CREATE DEBEZIUM SOURCE changes FROM KAFKA 'broker:9092'\n"
        "  TOPIC PATTERN 'shop\\\\..*' CONNECTOR MySQL\n"
        "  SCHEMA (id INT, name STRING) TABLE 'shop.customers' TRANSACTION ID AS `tx id`\n"
        "  OPTIONS (maxOffsetsPerTrigger = 1000, failOnDataLoss = false)"
    )
    assert source == DebeziumStatement(
        name="changes",
        options={
            "bootstrap_servers": "broker:9092",
            "connector": "mysql",
            "row_schema": "id INT, name STRING",
            "topic_pattern": "shop\\..*",
            "table": "shop.customers",
            "transaction_id": "tx id",
            "options": {"maxOffsetsPerTrigger": "1000", "failOnDataLoss": "false"},
        },
        location=Location("p.sql", 1, 1),
    )
    listed = one(
        "CREATE DEBEZIUM SOURCE c FROM KAFKA 'k:1' TOPICS ('a', 'b') CONNECTOR x SCHEMA (i INT)"
    )
    assert listed.options["topics"] == ["a", "b"] and listed.options["connector"] == "x"
    # Without SCHEMA, the row's columns come from the events' schemas.
    inferred = one("CREATE DEBEZIUM SOURCE c FROM KAFKA 'k:1' TOPICS ('a') CONNECTOR mysql")
    assert "row_schema" not in inferred.options


@pytest.mark.parametrize(
    ("text", "column", "problem"),
    [
        ("CREATE MATERIALIZED VIEW v AS SELECT 'abc", 38, "string"),
        ("CREATE MATERIALIZED VIEW v AS SELECT `abc", 38, "name"),
        ("SET a = 1 /* never closed", 11, "comment"),
        ("CREATE MATERIALIZED VIEW v AS SELECT (1", 40, "ends too early"),
        ("CREATE EXTRACTION SOURCE s FROM t ORDER BY at", 1, "has no CONNECTION"),
        ("CREATE EXTRACTION SOURCE s FROM t CONNECTION 'x' ORDER BY at DOWN", 62, "`DOWN`"),
        ("CREATE EXTRACTION SOURCE s FROM t CONNECTION 'x' LIMIT 1 LIMIT 2", 58, "LIMIT is given"),
        ("CREATE EXTRACTION SOURCE s FROM t CONNECTION 'x' LIMIT 'ten'", 56, "unexpected `'ten'`"),
        ("CREATE DEBEZIUM SOURCE s CONNECTOR mysql TOPICS ('t') SCHEMA (i INT)", 1, "FROM KAFKA"),
        ("CREATE DEBEZIUM SOURCE s FROM KAFKA 'k:1' CONNECTOR mysql SCHEMA (i INT)", 1, "TOPICS"),
        (
            "CREATE DEBEZIUM SOURCE s FROM KAFKA 'k:1' CONNECTOR mysql TOPICS ('t')\n"
            "  TOPIC PATTERN 't.*'",
            1,
            "one of TOPICS or TOPIC PATTERN",
        ),
    ],
)
def test_errors_point_at_the_problem(text: str, column: int, problem: str) -> None:
    """Unterminated text, and an extraction source's missing, unknown or repeated clause."""
    err = error(text)
    assert (err.params["line"], err.params["column"]) == (1, column)
    assert problem in err.params["problem"]


def test_message_says_where_and_what_to_do() -> None:
    message = str(error("AUTO CDC INTO t FROM s SEQUENCE BY ts"))
    assert message.startswith("[AUTOCDC_PIPELINE_SQL_SYNTAX] p.sql:1:24: unexpected `SEQUENCE`")
    assert "Expected one of: KEYS" in message


def test_once_flow() -> None:
    """AUTO CDC ONCE INTO: a backfill, its source read as one batch (STREAM or not)."""
    for source in ("s", "STREAM(s)"):
        flow = one(f"CREATE FLOW f AS AUTO CDC ONCE INTO t FROM {source} KEYS (id) SEQUENCE BY ts")
        assert (flow.name, flow.target, flow.once, flow.streaming) == ("f", "t", True, False)
    assert cdc("SEQUENCE BY ts").once is False


@pytest.mark.parametrize(
    ("clauses", "expected"),
    [
        ("COLUMNS TO UPDATE cols SEQUENCE BY ts", ("cols", None, None, False)),
        ("COLUMNS TO UPDATE (a, `b c`) COLUMNS a, `b c`", (["a", "b c"], None, None, False)),
        ("IGNORE NULL UPDATES ON a, b SEQUENCE BY ts", (None, ["a", "b"], None, False)),
        ("IGNORE NULL UPDATES ON * EXCEPT (c) COLUMNS TO UPDATE u", ("u", None, ["c"], False)),
        ("IGNORE NULL UPDATES COLUMNS a", (None, None, None, True)),
    ],
)
def test_partial_upsert_clauses(clauses: str, expected: tuple) -> None:
    flow = cdc(clauses)
    assert (
        flow.columns_to_update,
        flow.ignore_null_updates_column_list,
        flow.ignore_null_updates_except_column_list,
        flow.ignore_null_updates,
    ) == expected


def test_columns_to_update_given_twice() -> None:
    err = error("AUTO CDC INTO t FROM s KEYS (id) COLUMNS TO UPDATE a COLUMNS TO UPDATE b")
    assert "COLUMNS TO UPDATE" in err.params["problem"]


def test_sequence_group_clause() -> None:
    """SEQUENCE GROUP g IN (g (a, b), h (c)): the flow's group among the target's."""
    flow = cdc("SEQUENCE BY ts SEQUENCE GROUP w IN (shop (a, `b c`), w (d)) COLUMNS * EXCEPT (op)")
    assert (flow.sequence_group, flow.sequence_groups) == ("w", {"shop": ["a", "b c"], "w": ["d"]})
    assert (flow.sequence_by, flow.except_column_list) == ("ts", ["op"])
    assert cdc("SEQUENCE GROUP g IN (g (a)) SEQUENCE BY group").sequence_by == "group"
    assert cdc("SEQUENCE BY ts").sequence_groups is None
    twice = "SEQUENCE GROUP a IN (a (x))"
    err = error(f"AUTO CDC INTO t FROM s KEYS (id) {twice} {twice}")
    assert "SEQUENCE GROUP" in err.params["problem"]


@pytest.mark.parametrize(
    ("clause", "interval"),
    [
        ("MAX STALENESS INTERVAL 10 MINUTES", "10 MINUTES"),
        ("MAX STALENESS = INTERVAL '1 hour'", "1 hour"),
        ("MAX STALENESS '90 seconds'", "90 seconds"),
        ("MAX STALENESS INTERVAL 1 HOUR 30 MINUTES", "1 HOUR 30 MINUTES"),
    ],
)
def test_max_staleness(clause: str, interval: str) -> None:
    statement = cdc(f"SEQUENCE BY max_seq {clause} MAX STAGED ROWS 500")
    assert (statement.max_staleness, statement.max_staged_rows) == (interval, 500)
    assert statement.sequence_by == "max_seq"


def test_python_sql_and_the_definition_name_the_same_fields() -> None:
    """One field list: a flow option is spelled as the definition's field in ``dp`` and in
    the SQL statement (the registry passes the statement's fields by name), so a new one
    cannot be left out of either. SQL leaves to the table and to the run what Python
    declares per flow."""
    fields = set(FlowDefinition.model_fields)
    python = set(inspect.signature(dp.create_auto_cdc_flow).parameters)
    assert python - {"source", "once", "extract_options"} == fields
    statement = {f.name for f in dataclasses.fields(sql.AutoCdcStatement)}
    in_sql = statement - {"source", "once", "streaming", "location"}
    elsewhere = {"cluster_by", "table_properties"}  # the streaming table's clauses
    placed = {"partial_target", "snapshot_target"}  # the run's, for every flow into a target
    not_yet = {"tombstone_retention_days", "late_beyond_horizon"}  # Python only, for now
    assert in_sql == fields - elsewhere - placed - not_yet
