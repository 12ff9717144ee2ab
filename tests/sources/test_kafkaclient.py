"""Spark's Kafka options as autocdc's own client takes them: placeholders resolved from the
environment or files, what is recorded (never a secret), and librdkafka's settings. The
broker itself is asked in test_kafka_secured.py."""

from __future__ import annotations

import pytest

from autocdc.sources import kafkaclient
from autocdc.sources.errors import KafkaSecretError

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule required"
PLACEHOLDER_JAAS = f'{SCRAM} username="cdc" password="${{env:KC_PASSWORD}}";'
OPTIONS = {
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.mechanism": "SCRAM-SHA-512",
    "kafka.sasl.jaas.config": PLACEHOLDER_JAAS,
    "kafka.ssl.truststore.type": "PEM",
    "kafka.ssl.truststore.location": "/etc/kafka/ca.pem",
    "maxOffsetsPerTrigger": "100",
}


def test_placeholders_resolve_from_the_environment_and_files(monkeypatch, tmp_path):
    monkeypatch.setenv("KC_PASSWORD", 'pa"ss\\word')
    secret = tmp_path / "truststore-password"
    secret.write_text("changeit\nignored\n")
    given = {**OPTIONS, "kafka.ssl.truststore.password": f"${{file:{secret}}}"}
    resolved = kafkaclient.resolved(given)
    # Inside the JAAS line the value is escaped as its quoted strings need, and read back.
    assert resolved["kafka.sasl.jaas.config"].endswith('password="pa\\"ss\\\\word";')
    assert resolved["kafka.ssl.truststore.password"] == "changeit"
    assert resolved["maxOffsetsPerTrigger"] == "100"
    settings = kafkaclient.config(resolved)
    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "cdc",
        "sasl.password": 'pa"ss\\word',
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_an_unset_variable_or_unreadable_file_is_refused_by_name(monkeypatch, tmp_path):
    monkeypatch.delenv("KC_PASSWORD", raising=False)
    with pytest.raises(KafkaSecretError) as err:
        kafkaclient.resolved(OPTIONS)
    assert err.value.error_class == "AUTOCDC_KAFKA_SECRET"
    assert "environment variable KC_PASSWORD, which is not set. Set KC_PASSWORD" in str(err.value)
    missing = tmp_path / "nope"
    with pytest.raises(KafkaSecretError, match=f"file {missing}, which cannot be read"):
        kafkaclient.resolved({"kafka.ssl.truststore.password": f"${{file:{missing}}}"})


def test_what_is_recorded_keeps_placeholders_and_never_a_secret(monkeypatch):
    literal = f'{SCRAM} username="cdc" password="hunter2";'
    given = {
        **OPTIONS,
        "kafka.ssl.truststore.password": "changeit",
        "kafka.ssl.keystore.password": "${env:KC_KEYSTORE}",
    }
    kept = kafkaclient.recorded(given)
    assert kept["kafka.sasl.jaas.config"] == PLACEHOLDER_JAAS
    assert kept["kafka.ssl.truststore.password"] is None  # written as it is: left out
    assert kept["kafka.ssl.keystore.password"] == "${env:KC_KEYSTORE}"
    assert "maxoffsetspertrigger" not in kept  # only the securing options
    assert kafkaclient.recorded({**OPTIONS, "kafka.sasl.jaas.config": literal})[
        "kafka.sasl.jaas.config"
    ] is None  # fmt: skip
    assert "hunter2" not in (kafkaclient.record_option({"kafka.sasl.jaas.config": literal}) or "")
    # A record with a secret left out cannot be asked: the lag is unknown, not an error.
    monkeypatch.setenv("KC_PASSWORD", "x")
    assert kafkaclient.askable(kept) is None
    assert kafkaclient.askable(kafkaclient.recorded(OPTIONS))["sasl.password"] == "x"


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"kafka.security.protocol": "SASL_SSL"}, "SASL mechanism GSSAPI"),
        (
            {**OPTIONS, "kafka.sasl.mechanism": "PLAIN"},
            "not a PlainLoginModule line",
        ),
        ({"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "OAUTHBEARER"}, "OAUTH"),
    ],
)
def test_settings_it_cannot_take_are_named(options, said):
    with pytest.raises(kafkaclient.NotAskable, match=said):
        kafkaclient.config(options)


def test_a_plaintext_broker_needs_nothing_and_tls_without_host_check():
    assert kafkaclient.config({}) == {"security.protocol": "PLAINTEXT"}
    settings = kafkaclient.config(
        {
            "kafka.security.protocol": "SSL",
            "kafka.ssl.endpoint.identification.algorithm": "",
            "kafka.ssl.truststore.certificates": "-----BEGIN CERTIFICATE-----x",
        }
    )
    assert settings["ssl.endpoint.identification.algorithm"] == "none"
    assert settings["ssl.ca.pem"].startswith("-----BEGIN CERTIFICATE-----")
