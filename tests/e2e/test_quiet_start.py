"""A quiet start: Delta's jars come from the virtualenv, and the terminal shows only
autocdc's own lines; Spark's logs, the JVM's output and error details go to the log file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from delta import configure_spark_with_delta_pip
from processes import ROOT
from projects import write_spec
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from autocdc.engine import warmup
from autocdc.pipelines import cli
from autocdc.runtime import archive, dump, jars, session

NOISE = ("::", "resolving", "downloading", "artifacts", "log4j", "WARN", "JVM stacktrace")


def test_jars_are_resolved_once(tmp_path, monkeypatch):
    def resolve(*_):
        raise AssertionError("resolved again")

    monkeypatch.setattr(jars, "_resolve", resolve)
    names = ["io.delta_delta-spark.jar", "io.delta_delta-storage.jar"]
    for name in names:
        (tmp_path / name).write_bytes(b"jar")
    marker = {"coordinates": jars.coordinates(), "jars": names}
    (tmp_path / jars.MARKER).write_text(json.dumps(marker))
    assert jars.install(tmp_path) == [tmp_path / name for name in names]

    (tmp_path / names[1]).unlink()  # a jar gone: not installed any more
    assert jars.installed(tmp_path) is None
    (tmp_path / names[1]).write_bytes(b"jar")
    (tmp_path / jars.MARKER).write_text(json.dumps({**marker, "coordinates": ["io.delta:x:1"]}))
    assert jars.installed(tmp_path) is None  # resolved for another delta-spark


def test_the_class_archive_is_mapped_only_when_made_for_these_versions(tmp_path, monkeypatch):
    monkeypatch.setattr(jars, "jar_dir", lambda: tmp_path)
    assert archive.java_option() is None  # none made yet
    archive.path().write_bytes(b"jsa")
    (tmp_path / archive.MARKER).write_text(json.dumps(archive.marker_for(True)))
    assert archive.java_option() == f'"-XX:SharedArchiveFile={archive.path()}"'
    other = {**archive.marker_for(True), "pyspark": "4.1.0"}  # made for another pyspark
    (tmp_path / archive.MARKER).write_text(json.dumps(other))
    assert archive.java_option() is None
    assert dump.main(warmup.workload) == 2  # no jars here: not made
    assert archive.java_option() is None


def test_sessions_started_here_map_the_class_archive(spark):
    """`make setup` made the archive; the test session's JVM was started with it."""
    made = archive.usable()
    if made is None:
        if os.environ.get("CI"):
            pytest.fail("make setup wrote no class archive (python -m autocdc.engine.warmup)")
        pytest.skip("no class archive in this environment (python -m autocdc.engine.warmup)")
    bean = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert f"-XX:SharedArchiveFile={made}" in list(bean.getInputArguments())


def test_coordinate_is_delta_pip_helpers():
    builder = configure_spark_with_delta_pip(SparkSession.builder)
    assert builder._options["spark.jars.packages"] == jars.coordinate()


KAFKA = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
MINE = "com.example:mine_2.13:1.0"


@pytest.mark.parametrize("installed", [True, False])
def test_a_users_jars_and_packages_are_added_to_deltas_never_instead(monkeypatch, installed):
    """Following Spark's Kafka guide (``spark.jars.packages``) once dropped Delta's jars,
    and the session failed with "Cannot find catalog plugin class ... DeltaCatalog"."""
    local = [Path("/venv/jars/delta-spark.jar"), Path("/venv/jars/delta-storage.jar")]
    monkeypatch.setattr(jars, "installed", lambda: local if installed else None)
    settings = {"spark.jars.packages": f"{MINE}, ", "spark.jars": "/opt/mine.jar"}
    session._add_jars(settings)
    if installed:
        assert settings["spark.jars"] == ",".join(["/opt/mine.jar", *map(str, local)])
        assert settings["spark.jars.packages"] == f"{MINE}, "  # ivy resolves the user's
    else:
        assert settings["spark.jars"] == "/opt/mine.jar"
        drivers = ",".join(jars.JDBC_DRIVERS)
        assert settings["spark.jars.packages"] == f"{MINE},{jars.coordinate()},{KAFKA},{drivers}"
        # The user's own Kafka connector (Spark's guide says to add it) is not added twice.
        guide = {"spark.jars.packages": KAFKA}
        session._add_jars(guide)
        assert guide["spark.jars.packages"] == f"{KAFKA},{jars.coordinate()},{drivers}"
    # Packages naming a Delta build choose Delta's version themselves.
    own = {"spark.jars.packages": f"{KAFKA},io.delta:delta-spark_4.2_2.13:4.4.1"}
    session._add_jars(own)
    assert own == {"spark.jars.packages": f"{KAFKA},io.delta:delta-spark_4.2_2.13:4.4.1"}


def test_sessions_read_kafka_without_a_users_package(spark):
    """pyspark's wheel has no Kafka connector: without the session's own, a user following
    the Debezium guide met `Failed to find data source: kafka`. A batch read of a topic
    plans (its schema is the connector's) without reaching a broker."""
    read = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9")
        .option("subscribe", "changes")
        .load()
    )
    assert read.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]


class JavaError:
    """Stands for a JVM exception object as py4j hands it over."""

    _target_id = "o1"

    def __init__(self, text: str, cause: JavaError | None = None) -> None:
        self.text, self.cause = text, cause

    def toString(self) -> str:
        return self.text

    def getCause(self) -> JavaError | None:
        return self.cause

    def equals(self, other: object) -> bool:
        return other is self


def test_a_jvm_error_shows_its_first_line_and_its_root_causes():
    root = JavaError("x.SparkArithmeticException: [DIVIDE_BY_ZERO] Division by zero.\n== SQL ==")
    wrapped = JavaError("x.SparkException: [TASK_WRITE_FAILED] Task failed\n\tat x", root)
    assert cli._gist(Py4JJavaError("An error occurred", JavaError("a", wrapped))) == (
        "Py4JJavaError: a\n"
        "  caused by x.SparkArithmeticException: [DIVIDE_BY_ZERO] Division by zero."
    )
    assert cli._gist(Py4JJavaError("An error occurred", wrapped.cause)) == (
        "Py4JJavaError: x.SparkArithmeticException: [DIVIDE_BY_ZERO] Division by zero."
    )
    assert cli._gist(ValueError("bad\nvalue")) == "ValueError: bad"


def run(project: Path, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m autocdc run`` of a project holding ``files``, as a user runs it."""
    (project / "transformations").mkdir(parents=True)
    write_spec(project, "quiet")
    for name, text in files.items():
        (project / "transformations" / name).write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "autocdc", "run"],
        capture_output=True,
        text=True,
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )


@pytest.mark.e2e
def test_a_run_prints_only_autocdc_lines_and_an_error_in_one_line(tmp_path):
    assert jars.installed() is not None, "Delta's jars are not installed: run `make setup`"
    done = run(
        tmp_path,
        {
            "a.sql": "CREATE MATERIALIZED VIEW fine AS SELECT id FROM range(3);",
            "b.sql": "CREATE MATERIALIZED VIEW boom AS SELECT 1 / (id - id) AS x FROM fine;",
        },
    )
    assert done.returncode == 1
    log = tmp_path / "autocdc-logs" / "autocdc.log"
    assert done.stdout.splitlines() == [
        "autocdc: pipeline quiet: 2 datasets (fine, boom)",
        "autocdc: materialized view fine: 3 rows",
    ]
    # Spark raises the division's error itself or a failed write caused by it, as it goes
    *gist, where = done.stderr.splitlines()
    assert len(gist) in (1, 2) and gist[0].startswith("autocdc: "), done.stderr
    assert re.search(r"\w+: \[DIVIDE_BY_ZERO\] Division by zero", gist[-1]), done.stderr
    assert where == f"(details in {log})"
    details = log.read_text()
    assert "Traceback (most recent call last)" in details
    assert "org.apache.spark.SparkArithmeticException" in details  # the JVM's stack trace
    assert "resolving dependencies" not in details  # the session started from the venv's jars


@pytest.mark.e2e
def test_an_autocdc_error_is_one_block_and_pysparks_json_goes_to_the_log(tmp_path):
    done = run(tmp_path, {"a.sql": "CREATE MATERIALIZED VIEW v AS SELECT nope FROM range(1);"})
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("autocdc: [AUTOCDC_PIPELINE_FLOW_INVALID] transformations/a.sql")
    assert len(done.stderr.splitlines()) == 1, done.stderr  # without the analyzed plan
    assert not any(word in done.stderr for word in (*NOISE, '"errorClass"', "\tat "))
    details = (tmp_path / "autocdc-logs" / "autocdc.log").read_text()
    assert '"errorClass": "UNRESOLVED_COLUMN.WITH_SUGGESTION"' in details
