"""The servers of the Debezium -> Kafka -> autocdc example, on 127.0.0.1, in one command:
PostgreSQL (Debian's binaries, a throwaway cluster with a `customers` table of 3 rows), a
Kafka broker (KRaft, from Kafka's jars on Maven Central) and Kafka Connect with Debezium's
PostgreSQL connector writing its changes to topic `shop.public.customers`. Ctrl-C stops
them and deletes their data.

    .venv/bin/python pipelines/debezium-kafka/servers.py

It prints the psql command to type changes with and the `autocdc run` command that mirrors
them, with this virtualenv's `autocdc` and `--full-refresh-all`: the servers are new at
every start, so the mirror starts over with them (a checkpoint holds the offsets of the
broker it read, which the next start's broker does not have). The servers are the test
suite's own (tests/support): the end-to-end test of this example starts the same ones with
the same connector.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from kafkaserver import Broker, Connect  # noqa: E402  (the tests' servers, above)
from pgserver import Server  # noqa: E402

TOPIC = "shop.public.customers"
TABLE = """
CREATE TABLE customers (id int PRIMARY KEY, name text, city text);
INSERT INTO customers VALUES (1, 'Ann', 'Oslo'), (2, 'Bob', 'Rome'), (3, 'Cid', 'Kyiv');
"""


def connector(server: Server) -> dict[str, str]:
    """Debezium's PostgreSQL connector on ``server``'s `public.customers` (pgoutput, its
    own publication and slot); its topic is ``TOPIC``."""
    return {
        "name": "shop",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": "127.0.0.1",
        "database.port": str(server.port),
        "database.user": "postgres",
        "database.password": "",
        "database.dbname": "postgres",
        "topic.prefix": "shop",
        "plugin.name": "pgoutput",
        "slot.name": "autocdc_shop",
        "publication.autocreate.mode": "filtered",
        "table.include.list": "public.customers",
    }


def _stopped(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    server = Server().start()
    broker = connect = None
    work = tempfile.TemporaryDirectory(suffix="-connect")  # Connect's offsets and config
    try:
        server.execute(TABLE)
        broker = Broker().start()
        connect = Connect(broker, connector(server), Path(work.name)).start()
        spec = os.path.relpath(Path(__file__).with_name("spark-pipeline.yml"))
        autocdc = os.path.relpath(Path(sys.executable).with_name("autocdc"))
        print(
            "PostgreSQL, Kafka and Debezium are running (Ctrl-C stops them).\n"
            f'  changes:  psql "{server.dsn}"\n'
            f"  topic:    {TOPIC} on {broker.servers}\n"
            f"  mirror:   AUTOCDC_KAFKA={broker.servers} {autocdc} run --spec {spec} "
            "--continuous --full-refresh-all",
            flush=True,
        )
        for stop in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a background job ignores it
            signal.signal(stop, _stopped)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C: still cleaned up
        for started in (connect, broker):
            if started is not None:
                started.stop()
        server.stop()
        work.cleanup()


if __name__ == "__main__":
    main()
