"""Debezium's events through a real Kafka broker (KRaft, started here from Maven's jars):
the Debezium example's PostgreSQL flow reading the topic through ``CREATE DEBEZIUM SOURCE``
instead of files, run three times as the events arrive; and Debezium's own connector, the
source declared with ``dp.create_debezium_source``."""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import time
import uuid

import debeziumcase as case
import pytest
from changes import EVERYTHING
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from debeziumcase import debezium_event
from kafkaserver import Broker, Connect
from pgserver import Server
from processes import ROOT, finish, start
from projects import run, write_project
from reference import UPSERT, Change, fold_scd1, fold_scd2
from sparkconf import SMALL_SPARK

from autocdc import debezium_kafka
from autocdc.pipelines.declare import project
from autocdc.pipelines.errors import ReplayBeyondRetentionError
from autocdc.pipelines.execute import replay
from autocdc.pipelines.operations import overview
from autocdc.sources.errors import KafkaTopicNotFoundError

pytestmark = pytest.mark.e2e

EXAMPLE = ROOT / "pipelines" / "debezium"
TOPIC = "files.public.customers"  # not the example's topic: one broker serves the module
# The PostgreSQL flow of the example, reading Kafka: no glue but the source's declaration.
CUSTOMERS = """
CREATE DEBEZIUM SOURCE customer_changes FROM KAFKA '{servers}'
  TOPICS ('{topic}') CONNECTOR postgresql
  SCHEMA (id INT, name STRING, city STRING) TABLE 'public.customers';
CREATE STREAMING TABLE customers;
AUTO CDC INTO customers FROM customer_changes KEYS (id);
"""


@pytest.fixture(scope="module")
def broker():
    started = Broker().start()
    yield started
    started.stop()


def produce(spark, servers: str, values: list[str | None], topic: str = TOPIC) -> None:
    """Values as Debezium's JSON converter writes them; None is a Kafka tombstone."""
    rows = spark.createDataFrame([(v,) for v in values], "value string").coalesce(1)
    rows.write.format("kafka").option("kafka.bootstrap.servers", servers).option(
        "topic", topic
    ).save()


def test_debezium_topic_to_delta_across_runs(spark, broker, tmp_path, new_table, monkeypatch):
    """Each run applies only what arrived since the last (the query's checkpoint keeps the
    offsets: the one malformed event is quarantined once), Kafka and old-style tombstones
    are skipped, another table's events in the topic are left out, and the tables end as
    the example's hand-worked answer says; a replay from the earliest offsets leaves them
    so, and one from before what retention kept is refused."""
    root = tmp_path / "debezium"
    shutil.copytree(
        EXAMPLE, root, ignore=shutil.ignore_patterns("storage", "warehouse", "autocdc-*")
    )
    (root / "data" / "postgres").rename(tmp_path / "events")
    (root / "transformations" / "customers.py").unlink()  # declared in SQL instead
    (root / "transformations" / "customers.sql").write_text(
        CUSTOMERS.format(servers=broker.servers, topic=TOPIC)
    )
    (root / "transformations" / "products.py").unlink()  # the MySQL flow reads files
    database = new_table("dbz_kafka")
    spec = root / "spark-pipeline.yml"
    spec.write_text(spec.read_text() + f"database: {database}\n")
    monkeypatch.chdir(root)

    # Newer than every customers event: applied, it would win key 1.
    other_table = (
        '{"op":"c","before":null,"after":{"id":1,"name":"x","city":"y"},"source":{"schema":'
        '"public","table":"suppliers","sequence":"[null,\\"90000000\\"]","lsn":90000000}}'
    )
    tombstones = 0
    for i, name in enumerate(sorted((tmp_path / "events").iterdir())):
        values = [line or None for line in name.read_text().splitlines()]
        if i == 1:
            values += ['{"schema": null, "payload": null}', other_table]
        tombstones += sum(v is None or '"payload": null' in v for v in values)
        produce(spark, broker.servers, values)
        run(spark, spec)

    loader = importlib.util.spec_from_file_location("debezium_check", root / "check.py")
    check = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(check)
    customers = spark.table(f"{database}.customers").orderBy("id").collect()
    assert [tuple(r) for r in customers] == check.CUSTOMERS
    quarantine = spark.table(f"{database}.customers__autocdc_quarantine").collect()
    assert [r.reason for r in quarantine] == ["AUTOCDC_MALFORMED_RECORD"]
    # Tombstones: skipped and counted, each once.
    log = spark.read.format("delta").load(str(root / "storage" / "event_log"))
    skipped = log.where("event_type = 'batch'").selectExpr(
        "int(get_json_object(metrics, '$.skipped')) AS n"
    )
    assert tombstones > 1 and sum(r.n for r in skipped.collect()) == tombstones

    # Lag, asked of the broker: nothing behind after the run, then two records arrive.
    lag = overview.status(project.load(spec))["flows"][0]["lag"]
    assert (lag["records"], lag["oldest_age_seconds"]) == (0, None)
    produce(spark, broker.servers, [other_table, None])
    lag = overview.status(project.load(spec))["flows"][0]["lag"]
    assert lag["records"] == 2 and 0 <= lag["oldest_age_seconds"] < 60

    # Replayed from the earliest offsets: the same table, the malformed event not
    # quarantined twice, the replay logged with the offsets it reads from.
    run(spark, spec, replay_from=replay.parse("customers=offsets:earliest"))
    customers = spark.table(f"{database}.customers").orderBy("id").collect()
    assert [tuple(r) for r in customers] == check.CUSTOMERS
    assert spark.table(f"{database}.customers__autocdc_quarantine").count() == 1
    log = spark.read.format("delta").load(str(root / "storage" / "event_log"))
    (logged,) = log.where("event_type = 'replay'").collect()
    assert json.loads(logged.source_position)[0]["offset"] == {TOPIC: {"0": 0}}
    # Records deleted by retention: a replay from before them is refused, nothing written.
    admin = AdminClient({"bootstrap.servers": broker.servers})
    (deleted,) = admin.delete_records([TopicPartition(TOPIC, 0, 2)]).values()
    deleted.result(timeout=30)
    del admin, deleted  # its connection closed before the broker stops
    written = spark.sql(f"DESCRIBE HISTORY {database}.customers").first().version
    for given in (f'customers=offsets:{{"{TOPIC}":{{"0":1}}}}', "customers=timestamp:2000-01-01"):
        with pytest.raises(ReplayBeyondRetentionError) as refused:
            run(spark, spec, replay_from=replay.parse(given))
        assert refused.value.params["oldest"] == f'offsets:{{"{TOPIC}": {{"0": 2}}}}'
    assert spark.sql(f"DESCRIBE HISTORY {database}.customers").first().version == written


def test_a_topic_not_on_the_broker_is_named(spark, broker):
    with pytest.raises(KafkaTopicNotFoundError) as err:
        debezium_kafka(
            spark, bootstrap_servers=broker.servers, connector="mysql", topics=["shop.nope"]
        )
    assert "['shop.nope'] are not on the Kafka broker" in str(err.value)


LIVE = ROOT / "pipelines" / "debezium-kafka"  # the example, and its servers.py
AFTER_RESTART = [
    "ALTER TABLE customers ADD COLUMN email text",  # taken from the events' schemas
    "UPDATE customers SET city = 'Turin', email = 'eve@x' WHERE id = 5",
    "BEGIN; UPDATE customers SET id = 6 WHERE id = 4; COMMIT",  # a primary-key change
]


def test_debeziums_postgres_connector_through_kafka_mirrors_the_table(
    spark, broker, tmp_path, new_table, monkeypatch
):
    """The whole open-source path, as the example pipelines/debezium-kafka runs it (its
    servers.py's table and connector, its pipeline): PostgreSQL, Debezium's connector in
    Kafka Connect, the broker, a pipeline over the topic. Connect is killed and restarted
    once (it delivers again what followed its last flushed offset). After each round the
    SCD1 target equals the table, and the SCD2 target's open rows equal it with one version
    per change, each with its transaction's id. The row schema is taken from the events,
    and a column added to the table while Connect is down reaches the targets."""
    loader = importlib.util.spec_from_file_location("live_servers", LIVE / "servers.py")
    servers = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(servers)
    server = Server().start()
    connect = None
    try:
        server.execute(servers.TABLE)
        connect = Connect(broker, servers.connector(server), tmp_path / "connect").start()
        database = new_table("dbz_live")
        root = tmp_path / "live"
        shutil.copytree(LIVE, root, ignore=shutil.ignore_patterns("storage", "warehouse"))
        spec = root / "spark-pipeline.yml"
        spec.write_text(spec.read_text() + f"database: {database}\n")
        monkeypatch.chdir(root)
        monkeypatch.setenv("AUTOCDC_KAFKA", broker.servers)

        def table() -> list[tuple]:
            return server.query("SELECT id, name, city FROM customers")

        for sql in case.WRITES:
            server.execute(sql)
        case.written(broker.servers, servers.TOPIC, 3)
        case.mirror(spark, spec, table, database)
        connect.stop()
        for sql in AFTER_RESTART:
            server.execute(sql)
        connect.start()
        case.mirror(spark, spec, table, database)

        assert case.versions(spark, database) == case.VERSIONS
        history = spark.table(f"{database}.customers_history")
        # The transaction id: one for the two rows inserted together, another for each
        # single-statement transaction.
        first = {k: history.where(f"id = {k}").orderBy("__START_AT").first().txid for k in (4, 5)}
        assert first[4] == first[5] and first[4].isdigit()
        updated = history.where("id = 1 AND name IS NULL").first().txid
        assert updated.isdigit() and updated != first[4]
        emails = spark.table(f"{database}.customers").where("email IS NOT NULL")
        assert [(r.id, r.email) for r in emails.collect()] == [(5, "eve@x")]
        quarantine = f"{database}.customers__autocdc_quarantine"
        # Made with its first quarantined row: nothing was.
        assert not spark.catalog.tableExists(quarantine)
    finally:
        if connect is not None:
            connect.stop()
        server.stop()


KILLED = """
from autocdc import pipelines as dp

dp.create_debezium_source(
    name="changes", bootstrap_servers="{servers}", topics=["{topic}"], connector="postgresql"
)
dp.create_streaming_table("latest")
dp.create_auto_cdc_flow(target="latest", source="changes", keys=["id"])
dp.create_streaming_table("history")
dp.create_auto_cdc_flow(target="history", source="changes", keys=["id"], stored_as_scd_type=2)
"""


def wait_for(check, what: str, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(1)


def test_a_continuous_run_killed_mid_stream_and_a_column_added_while_it_runs(
    spark, broker, tmp_path
):
    """``autocdc run --continuous`` over a Debezium topic: SIGKILLed inside its first apply,
    run again; a column appears in the events while it runs (the flow stops that batch
    and starts again with the column); SIGKILLed again while events arrive; run until it
    has caught up, then stopped. Both targets equal the reference fold of the changes."""
    topic = f"killed.{uuid.uuid4().hex[:8]}"
    events = [debezium_event(c) for c in EVERYTHING]
    added = debezium_event(Change(9, 1, UPSERT, ("i1", 1)), extra={"c": 7})
    config = {**SMALL_SPARK, "spark.sql.warehouse.dir": str(tmp_path / "warehouse")}
    spec = write_project(
        tmp_path, "kafka_killed", {"f.py": KILLED.format(servers=broker.servers, topic=topic)},
        config,
    )  # fmt: skip
    tables = tmp_path / "warehouse" / "kafka_killed.db"
    continuous = ("--continuous", "--trigger-interval", "1s")

    def latest() -> dict:
        if not (tables / "latest" / "_delta_log").is_dir():
            return {}
        rows = spark.read.format("delta").load(str(tables / "latest")).collect()
        return {r.id: r.asDict() for r in rows}

    def values() -> dict:
        return {k: (v["a"], v["b"]) for k, v in latest().items()}

    def versions() -> list:
        if not (tables / "history" / "_delta_log").is_dir():
            return []
        history = spark.read.format("delta").load(str(tables / "history")).collect()
        return sorted((r.id, r.a, r.b, r["__END_AT"] is None) for r in history)

    produce(spark, broker.servers, events[:5], topic)
    assert finish(start(spec, "after_state_commit", *continuous)) == -signal.SIGKILL
    run = start(spec, None, *continuous)
    produce(spark, broker.servers, events[5:10], topic)
    wait_for(lambda: values() == fold_scd1(EVERYTHING[:10]), "10 changes")
    produce(spark, broker.servers, [added], topic)
    wait_for(lambda: latest().get(9, {}).get("c") == 7, "the added column")
    produce(spark, broker.servers, events[10:], topic)
    time.sleep(2)
    run.send_signal(signal.SIGKILL)
    finish(run)

    run = start(spec, None, *continuous)
    everything = {**fold_scd1(EVERYTHING), 9: ("i1", 1)}
    folded = [(k, *v, end is None) for k, v, _start, end in fold_scd2(EVERYTHING)]
    history = sorted([*folded, (9, "i1", 1, True)])
    wait_for(lambda: (values(), versions()) == (everything, history), "all changes")
    run.send_signal(signal.SIGTERM)
    assert finish(run) == 0

    assert {k for k, v in latest().items() if v["c"] is not None} == {9}
    log = spark.read.format("delta").load(str(tmp_path / "storage" / "event_log"))
    restarts = log.where("error_class = 'AUTOCDC_DEBEZIUM_SCHEMA_CHANGED'").select("flow")
    assert sorted(r.flow for r in restarts.collect()) == ["history", "latest"]
