"""A Debezium source on a broker that requires SASL_SSL (SCRAM-SHA-512, a certificate for
127.0.0.1 that keytool made, trusted through a JKS trust store), declared with Spark's
``kafka.`` options and its secrets as placeholders: autocdc's own client checks the topic,
takes the row schema from the events and tells the lag; ``autocdc run`` is killed inside
its first apply and run again; no secret reaches a file the runs wrote; a wrong password
and a certificate for another host are refused before anything is read. One broker."""

from __future__ import annotations

import json
import signal
import time

import pytest
from changes import EVERYTHING
from confluent_kafka import Producer
from debeziumcase import debezium_event
from kafkaserver import Broker
from processes import finish, start
from projects import write_spec
from reference import fold_scd1
from sparkconf import SMALL_SPARK

from autocdc import debezium_kafka
from autocdc.pipelines.declare import project
from autocdc.pipelines.operations import overview
from autocdc.sources.errors import (
    KafkaAuthenticationError,
    KafkaTlsError,
    KafkaTopicNotFoundError,
)

pytestmark = pytest.mark.e2e

TOPIC = "secured.public.t"
PASSWORD_ENV = "AUTOCDC_TEST_KAFKA_PASSWORD"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule required"
PIPELINE = """
from autocdc import pipelines as dp

dp.create_debezium_source(
    name="changes", bootstrap_servers={servers!r}, topics=[{topic!r}],
    connector="postgresql", options={options!r},
)
dp.create_streaming_table("latest")
dp.create_auto_cdc_flow(target="latest", source="changes", keys=["id"])
"""


@pytest.fixture(scope="module")
def broker():
    started = Broker(secured=True).start()
    yield started
    started.stop()


def produce(broker: Broker, values: list[str]) -> None:
    """Through the PLAINTEXT listener: what is tested is the reading side."""
    producer = Producer({"bootstrap.servers": broker.servers})
    for value in values:
        producer.produce(TOPIC, value.encode())
    assert producer.flush(30) == 0


def options(broker: Broker, tmp_path, user: str = "cdc") -> dict[str, str]:
    """Spark's options for the SASL_SSL listener, the secrets as placeholders."""
    secret = tmp_path / "truststore-password"
    secret.write_text(broker.truststore_password + "\n")
    return {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": f'{SCRAM} username="{user}" password="${{env:{PASSWORD_ENV}}}";',
        "kafka.ssl.truststore.location": str(broker.truststore),
        "kafka.ssl.truststore.password": f"${{file:{secret}}}",
    }


def test_a_sasl_ssl_broker_is_read_checked_and_measured(spark, broker, tmp_path, monkeypatch):
    password = broker.users["cdc"]
    monkeypatch.setenv(PASSWORD_ENV, password)
    produce(broker, [debezium_event(c) for c in EVERYTHING])
    root = tmp_path / "project"
    (root / "transformations").mkdir(parents=True)
    settings = {**SMALL_SPARK, "spark.sql.warehouse.dir": str(tmp_path / "warehouse")}
    spec = write_spec(root, "secured", "secured", settings)
    declared = options(broker, tmp_path)
    (root / "transformations" / "source.py").write_text(
        PIPELINE.format(servers=broker.sasl_servers, topic=TOPIC, options=declared)
    )

    # Killed inside its first apply, then run again: the target is the reference fold,
    # its columns taken from the events' schemas (none declared).
    assert finish(start(spec, "after_state_commit")) == -signal.SIGKILL
    assert finish(start(spec, None)) == 0
    target = spark.read.format("delta").load(str(tmp_path / "warehouse" / "secured.db" / "latest"))
    assert target.columns == ["id", "a", "b"]
    assert {r.id: (r.a, r.b) for r in target.collect()} == fold_scd1(EVERYTHING)

    # The lag, asked of the secured broker with the recorded placeholders resolved here.
    assert overview.status(project.load(spec))["flows"][0]["lag"]["records"] == 0
    produce(broker, [debezium_event(EVERYTHING[0])] * 2)
    assert overview.status(project.load(spec))["flows"][0]["lag"]["records"] == 2
    monkeypatch.delenv(PASSWORD_ENV)  # not in this environment: unknown, no error
    assert overview.status(project.load(spec))["flows"][0]["lag"]["records"] is None

    # What the runs wrote holds the placeholders, never a secret.
    log = spark.read.format("delta").load(str(root / "storage" / "event_log"))
    recorded = log.where("source_position IS NOT NULL").first().source_position
    assert json.loads(recorded)[0]["client"] == {k.lower(): v for k, v in declared.items()}
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "truststore" not in p.name]
    assert any("autocdc-logs" in str(p) for p in written) and len(written) > 20
    for secret in (password, broker.truststore_password):
        leaked = [p for p in written if secret.encode() in p.read_bytes()]
        assert not leaked, f"a secret in {leaked}"


def test_a_wrong_password_or_host_is_refused_before_anything_is_read(
    spark, broker, tmp_path, monkeypatch
):
    """The broker's refusal, at once (not a timeout), with what to fix."""
    source = {"connector": "postgresql", "topics": [TOPIC]}
    monkeypatch.setenv(PASSWORD_ENV, "not-the-password")
    began = time.monotonic()
    with pytest.raises(KafkaAuthenticationError) as err:
        debezium_kafka(
            spark,
            bootstrap_servers=broker.sasl_servers,
            options=options(broker, tmp_path),
            **source,
        )
    assert time.monotonic() - began < 5
    assert err.value.error_class == "AUTOCDC_KAFKA_AUTHENTICATION"
    said = str(err.value)
    assert "refused the credentials of user 'cdc' (SCRAM-SHA-512)" in said
    assert "Nothing was read. Check the username and password in `kafka.sasl.jaas.config`" in said
    assert "not-the-password" not in said

    monkeypatch.setenv(PASSWORD_ENV, broker.users["cdc"])
    host = broker.sasl_servers.replace("127.0.0.1", "localhost")  # the certificate's is the IP
    with pytest.raises(KafkaTlsError) as err:
        debezium_kafka(spark, bootstrap_servers=host, options=options(broker, tmp_path), **source)
    assert err.value.error_class == "AUTOCDC_KAFKA_TLS"
    with pytest.raises(KafkaTopicNotFoundError, match=r"\['secured.nope'\] are not on"):
        debezium_kafka(
            spark,
            bootstrap_servers=broker.sasl_servers,
            options=options(broker, tmp_path),
            connector="postgresql",
            topics=["secured.nope"],
        )
