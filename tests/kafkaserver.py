"""A throwaway Kafka broker for the end-to-end tests: one KRaft node (broker and controller)
on 127.0.0.1 at free ports, from Kafka's jars on Maven Central (resolved once into the
virtualenv, as the session's jars are), with a small heap and its logs in a temp folder."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from pyspark.find_spark_home import _find_spark_home

from autocdc.engine import jars
from autocdc.engine.errors import AutoCdcError

BROKER = "org.apache.kafka:kafka_2.13:4.4.0"
# Kafka's jars bring no slf4j binding: without one the broker logs nothing at all.
LOGGING = "org.apache.logging.log4j:log4j-slf4j2-impl:2.24.3"
HEAP = "-Xmx384m"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broker_jars() -> list[Path]:
    """Kafka's broker and its dependencies, resolved from Maven Central on first use, and
    the Scala library, which Spark's resolution leaves out (pyspark has the same 2.13)."""
    scala = sorted((Path(_find_spark_home()) / "jars").glob("scala-library-2.13.*.jar"))
    try:
        return [*jars.install(jars.jar_dir().parent / "kafka-broker", [BROKER, LOGGING]), *scala]
    except AutoCdcError as error:
        if os.environ.get("CI"):
            pytest.fail(f"Kafka's jars could not be resolved: {error}")
        pytest.skip(f"Kafka's jars could not be resolved: {error}")


class Broker:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="autocdc-kafka-"))
        self.port, self.controller = _free_port(), _free_port()
        self.servers = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.classpath = os.pathsep.join(str(j) for j in broker_jars())

    def _java(self, *args: str) -> list[str]:
        java = (
            Path(os.environ["JAVA_HOME"]) / "bin" / "java" if "JAVA_HOME" in os.environ else "java"
        )
        return [str(java), HEAP, "-XX:+UseSerialGC", "-cp", self.classpath, *args]

    def _properties(self) -> Path:
        config = self.root / "server.properties"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.root / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
        }
        config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return config

    def start(self, timeout: float = 60) -> Broker:
        config = self._properties()
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        log = self.root / "broker.log"
        with log.open("ab") as out:
            formatted = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(config)),
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
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"the Kafka broker did not listen within {timeout} s: see {log}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if not os.environ.get("AUTOCDC_KEEP_KAFKA"):
            shutil.rmtree(self.root, ignore_errors=True)
