"""Debezium's MariaDB connector (the binlog family ``connector="mysql"`` reads) through a
real Kafka broker (KRaft) and Kafka Connect, reading a real MariaDB server's binary log,
mirrored by a pipeline declared with ``dp.create_debezium_source``."""

from __future__ import annotations

import dataclasses
import re

import debeziumcase as case
import pytest
from kafkaserver import MARIADB, Broker, Connect
from mariadbserver import REPLICATOR, REPLICATOR_PASSWORD, MariaDB, start

pytestmark = pytest.mark.e2e

TOPIC = "binlog.shop.customers"
SOURCE = f"""topics=["{TOPIC}"],
    connector="mysql",
    table="shop.customers","""
AFTER_RESTART = [
    "ALTER TABLE customers ADD COLUMN email varchar(50)",  # taken from the events' schemas
    "UPDATE customers SET city = 'Turin', email = 'eve@x' WHERE id = 5",
    "UPDATE customers SET id = 6 WHERE id = 4",  # a primary-key change
]


@pytest.fixture(scope="module")
def broker():
    started = Broker().start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def mariadb(tmp_path_factory):
    with start(tmp_path_factory.mktemp("mariadb"), binlog=True) as server:
        yield server


def test_debeziums_binlog_connector_through_kafka_mirrors_a_mariadb_table(
    spark, broker, mariadb, tmp_path, new_table, monkeypatch
):
    """MariaDB's binary log, Debezium's connector in Kafka Connect, the broker, a pipeline
    over the topic. Connect is killed and restarted once (it delivers again what followed
    its last flushed offset); while it is down the binary log moves to a new file (the
    position's file number orders the changes after it). After each round the SCD1 target
    equals the table, and the SCD2 target's open rows equal it with one version per change,
    each with its transaction's GTID. The row schema is taken from the events, and a column
    added to the table while Connect is down reaches the targets."""
    mariadb.sql(
        "CREATE TABLE customers (id int PRIMARY KEY, name varchar(50), city varchar(50));"
        "INSERT INTO customers VALUES (1, 'Ann', 'Oslo'), (2, 'Bob', 'Rome');"
        "INSERT INTO customers VALUES (3, 'Cid', 'Kyiv')"
    )
    connect = Connect(broker, _connector(mariadb, broker), tmp_path / "connect", MARIADB)
    try:
        connect.start()
        database = new_table("dbz_binlog")
        spec = case.project(tmp_path / "binlog", broker.servers, SOURCE, database)
        monkeypatch.chdir(spec.parent)

        def table() -> list[tuple]:
            rows = mariadb.sql("SELECT id, name, city FROM customers")
            return [(int(i), name, city) for i, name, city in rows]

        # The snapshot first: taken after some of the writes, it would hold their result
        # instead of the versions before them.
        case.written(broker.servers, TOPIC, 3)
        for sql in case.WRITES:
            mariadb.sql(sql)
        # A delete is two records (the event, then a tombstone): 3 + 9 in all.
        case.written(broker.servers, TOPIC, 12)
        case.mirror(spark, spec, table, database)
        connect.stop()
        dataclasses.replace(mariadb, user=REPLICATOR, password=REPLICATOR_PASSWORD).sql(
            "FLUSH BINARY LOGS"  # mysql-bin.000002: its positions start small again
        )
        for sql in AFTER_RESTART:
            mariadb.sql(sql)
        connect.start()
        # The key change is a delete (and its tombstone) and an insert.
        case.written(broker.servers, TOPIC, 16)
        case.mirror(spark, spec, table, database)

        assert case.versions(spark, database) == case.VERSIONS
        history = spark.table(f"{database}.customers_history")
        # The transaction id is MariaDB's GTID (domain-server-sequence): one for the two
        # rows inserted together, another for each single-statement transaction; the
        # snapshot's reads have none.
        first = {
            k: history.where(f"id = {k}").orderBy("__START_AT").first().txid for k in (1, 4, 5)
        }
        assert first[1] is None
        assert first[4] == first[5] and re.fullmatch(r"\d+-\d+-\d+", first[4])
        updated = history.where("id = 1 AND name IS NULL").first().txid
        assert re.fullmatch(r"\d+-\d+-\d+", updated) and updated != first[4]
        emails = spark.table(f"{database}.customers").where("email IS NOT NULL")
        assert [(r.id, r.email) for r in emails.collect()] == [(5, "eve@x")]
        quarantine = f"{database}.customers__autocdc_quarantine"
        # Made with its first quarantined row: nothing was.
        assert not spark.catalog.tableExists(quarantine)
    finally:
        connect.stop()


def _connector(server: MariaDB, broker: Broker) -> dict[str, str]:
    return {
        "name": "binlog",
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "database.hostname": server.host,
        "database.port": str(server.port),
        "database.user": REPLICATOR,
        "database.password": REPLICATOR_PASSWORD,
        "database.server.id": "5401",  # as a replica: not the server's own id (1)
        "topic.prefix": "binlog",
        "database.include.list": server.database,
        "table.include.list": f"{server.database}.customers",
        "schema.history.internal.kafka.bootstrap.servers": broker.servers,
        "schema.history.internal.kafka.topic": "binlog-schema-history",
        "snapshot.mode": "initial",
    }
