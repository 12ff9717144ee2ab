"""A throwaway Kafka broker for the end-to-end tests: one KRaft node (broker and controller)
on 127.0.0.1 at free ports, from Kafka's jars on Maven Central (resolved once into the
virtualenv, as the session's jars are), with a small heap and its logs in a temp folder;
and a Kafka Connect worker (standalone) running one of Debezium's connectors (PostgreSQL's
unless told). A broker started ``secured`` also listens for SASL_SSL clients: SCRAM users
created when its storage is formatted, and a certificate for 127.0.0.1 that Java's keytool
makes for it (and a trust store holding it)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from ports import free_port
from pyspark.find_spark_home import _find_spark_home
from sparkconf import PRODUCERS_CLOSED_WITHIN

from autocdc.runtime import AutoCdcError, jars

BROKER = "org.apache.kafka:kafka_2.13:4.4.0"
# Kafka's jars bring no slf4j binding: without one the broker logs nothing at all.
LOGGING = "org.apache.logging.log4j:log4j-slf4j2-impl:2.24.3"
HEAP = "-Xmx384m"
POSTGRES = "io.debezium:debezium-connector-postgres:3.6.1.Final"
# Debezium 3's MySQL connector refuses MariaDB (3.6.1 against 10.11: "should support SHOW
# BINARY LOG STATUS"); MariaDB has its own, whose newest on Maven Central is 3.5.0, which
# runs in the same worker.
MARIADB = "io.debezium:debezium-connector-mariadb:3.5.0.Final"
# Debezium 3.6 is built against Kafka 4.3: its worker must be Connect 4.3 (with 4.4:
# NoClassDefFoundError org/apache/kafka/common/utils/Sanitizer); a 4.4 broker serves it.
CONNECT = [
    "org.apache.kafka:connect-runtime:4.3.0",
    "org.apache.kafka:connect-json:4.3.0",
    POSTGRES,
    LOGGING,
]


def connect_jars(plugin: str = POSTGRES) -> list[Path]:
    """The worker with Debezium's connector ``plugin`` (Maven coordinates), each set in its
    own folder (PostgreSQL's in ``kafka-connect``), so tests of different connectors do not
    resolve one folder over and over."""
    name = plugin.split(":")[1].removeprefix("debezium-connector-")
    folder = "kafka-connect" if plugin == POSTGRES else f"kafka-connect-{name}"
    return _jars(folder, [plugin if c == POSTGRES else c for c in CONNECT])


def _jars(folder: str, wanted: list[str]) -> list[Path]:
    """``wanted`` and their dependencies, resolved from Maven Central on first use."""
    try:
        return jars.install(jars.jar_dir().parent / folder, wanted)
    except AutoCdcError as error:
        if os.environ.get("CI"):
            pytest.fail(f"Kafka's jars could not be resolved: {error}")
        pytest.skip(f"Kafka's jars could not be resolved: {error}")


def _java(classpath: list[Path], *args: str) -> list[str]:
    java = shutil.which("java") or "java"
    return [java, HEAP, "-XX:+UseSerialGC", "-cp", os.pathsep.join(map(str, classpath)), *args]


def broker_jars() -> list[Path]:
    """Kafka's broker, and the Scala library, which Spark's resolution leaves out (pyspark
    has the same 2.13)."""
    scala = sorted((Path(_find_spark_home()) / "jars").glob("scala-library-2.13.*.jar"))
    return [*_jars("kafka-broker", [BROKER, LOGGING]), *scala]


def _keytool(*args: str) -> None:
    java = shutil.which("java")
    keytool = shutil.which("keytool") or str(
        Path(os.path.realpath(java or "java")).with_name("keytool")
    )
    done = subprocess.run([keytool, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


class Broker:
    """One node; with ``secured``, a SASL_SSL listener too (``sasl_servers``): SCRAM-SHA-512
    users ``users`` (name -> password), its certificate trusted by the JKS file
    ``truststore`` (password ``truststore_password``). The PLAINTEXT listener stays, for
    the tests' producers and inter-broker traffic."""

    def __init__(self, secured: bool = False) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="autocdc-kafka-"))
        self.port, self.controller = free_port(), free_port()
        self.servers = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.classpath = os.pathsep.join(str(j) for j in broker_jars())
        self.secured = secured
        self.sasl_port = free_port() if secured else None
        self.sasl_servers = f"127.0.0.1:{self.sasl_port}" if secured else None
        self.users = {"cdc": f"scram-{uuid.uuid4().hex}"} if secured else {}
        self.truststore = self.root / "tls" / "truststore.jks"
        self.truststore_password = f"trust-{uuid.uuid4().hex[:12]}"
        self._keystore_password = uuid.uuid4().hex

    def _certificate(self) -> None:
        """A self-signed certificate for 127.0.0.1 (the broker's key store, PKCS12) and a
        JKS trust store holding it, Kafka's default trust store type."""
        tls = self.truststore.parent
        tls.mkdir(parents=True, exist_ok=True)
        keystore, pem, password = tls / "broker.p12", tls / "broker.pem", self._keystore_password
        _keytool("-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048",
                 "-validity", "7", "-dname", "CN=127.0.0.1", "-ext", "SAN=ip:127.0.0.1",
                 "-keystore", str(keystore), "-storetype", "PKCS12", "-storepass", password,
                 "-keypass", password)  # fmt: skip
        _keytool("-exportcert", "-alias", "broker", "-rfc", "-file", str(pem), "-keystore",
                 str(keystore), "-storetype", "PKCS12", "-storepass", password)  # fmt: skip
        _keytool("-importcert", "-noprompt", "-alias", "broker", "-file", str(pem),
                 "-keystore", str(self.truststore), "-storetype", "JKS",
                 "-storepass", self.truststore_password)  # fmt: skip

    def _secured_settings(self) -> dict[str, str]:
        keystore = self.truststore.parent / "broker.p12"
        listener = "listener.name.sasl_ssl."
        return {
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            f"{listener}sasl.enabled.mechanisms": "SCRAM-SHA-512",
            f"{listener}scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            f"{listener}ssl.keystore.location": str(keystore),
            f"{listener}ssl.keystore.type": "PKCS12",
            f"{listener}ssl.keystore.password": self._keystore_password,
            f"{listener}ssl.key.password": self._keystore_password,
        }

    def _java(self, *args: str) -> list[str]:
        java = (
            Path(os.environ["JAVA_HOME"]) / "bin" / "java" if "JAVA_HOME" in os.environ else "java"
        )
        return [str(java), HEAP, "-XX:+UseSerialGC", "-cp", self.classpath, *args]

    def _properties(self) -> Path:
        config = self.root / "server.properties"
        listeners = f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller}"
        advertised = f"PLAINTEXT://127.0.0.1:{self.port}"
        protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        if self.secured:
            listeners += f",SASL_SSL://127.0.0.1:{self.sasl_port}"
            advertised += f",SASL_SSL://127.0.0.1:{self.sasl_port}"
            protocols += ",SASL_SSL:SASL_SSL"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller}",
            "listeners": listeners,
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": protocols,
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.root / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            **(self._secured_settings() if self.secured else {}),
        }
        config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return config

    def start(self, timeout: float = 60) -> Broker:
        if self.secured:
            self._certificate()
        config = self._properties()
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        log = self.root / "broker.log"
        users = [  # SCRAM credentials, written with the cluster's first metadata
            arg
            for name, password in self.users.items()
            for arg in ("--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]")
        ]
        with log.open("ab") as out:
            formatted = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(config), *users
                ),
                stdout=out,
                stderr=out,
            )
            if formatted.returncode:
                raise RuntimeError(f"formatting Kafka's storage failed: see {log}")
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(config)), stdout=out, stderr=out
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited: see {log}")
            try:
                for port in (self.port, self.sasl_port):
                    if port is not None:
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"the Kafka broker did not listen within {timeout} s: see {log}")

    def stop(self) -> None:
        """Stop the broker once the test JVMs' pooled producers closed (see
        ``sparkconf.PRODUCERS_CLOSED_WITHIN``): they would call its port for minutes."""
        if self.process is not None and self.process.poll() is None:
            time.sleep(PRODUCERS_CLOSED_WITHIN)
            self.process.kill()
            self.process.wait()
        if not os.environ.get("AUTOCDC_KEEP_KAFKA"):
            shutil.rmtree(self.root, ignore_errors=True)


class Connect:
    """A standalone Connect worker on ``broker`` running one connector (``connector``:
    its properties; ``plugin``: the Maven coordinates of its jar), JSON values with schemas
    (Debezium's usual set-up), its offsets in a file: a restarted worker resumes from them
    and delivers again what followed."""

    def __init__(
        self, broker: Broker, connector: dict[str, str], root: Path, plugin: str = POSTGRES
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.broker, self.connector = broker, connector
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.classpath = connect_jars(plugin)

    def start(self, timeout: float = 120) -> Connect:
        worker = {
            "bootstrap.servers": self.broker.servers,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.storage.file.filename": str(self.root / "offsets"),
            "offset.flush.interval.ms": "500",
            "listeners": f"http://127.0.0.1:{self.port}",
        }
        files = []
        for name, settings in (("worker", worker), ("connector", self.connector)):
            files.append(self.root / f"{name}.properties")
            files[-1].write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        log = self.root / "connect.log"
        with log.open("ab") as out:
            command = _java(
                self.classpath,
                "org.apache.kafka.connect.cli.ConnectStandalone",
                *map(str, files),
            )
            self.process = subprocess.Popen(command, stdout=out, stderr=out)
        name = self.connector["name"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Kafka Connect exited: see {log}")
            status = self._get(f"/connectors/{name}/status")
            tasks = (status or {}).get("tasks", [])
            if tasks and all(t["state"] == "RUNNING" for t in tasks):
                return self
            if any(t["state"] == "FAILED" for t in tasks):
                raise RuntimeError(f"connector {name} failed: {tasks[0].get('trace', '')[:2000]}")
            time.sleep(0.5)
        raise RuntimeError(f"connector {name} did not run within {timeout} s: see {log}")

    def _get(self, path: str) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return json.load(r)
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
