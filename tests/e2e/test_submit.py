"""``spark-submit`` runs a pipeline project: on a local master, and on a real standalone
cluster (a master and one worker on this machine), each with the demo's hand-worked answer.

The launcher's JVM starts in a folder other than the project's, as a scheduler's would, so
relative paths in the spec and the definitions must still be the project's.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pyspark
import pytest
from ports import free_port
from processes import ROOT, child_env, error_tail
from pyspark.sql import DataFrame, SparkSession
from sparkconf import JVM_OPTIONS

SPARK_HOME = Path(pyspark.__file__).parent  # the wheel ships bin/spark-submit, spark-class
DELTA = "io.delta:delta-spark_4.2_2.13:4.4.0"
# Small Spark for a 2-core machine; the launcher's settings win over autocdc's settings files.
SMALL = [
    *("--driver-memory", "1g", "--driver-java-options", JVM_OPTIONS),
    *("--conf", "spark.sql.shuffle.partitions=1"),
]
TIMEOUT = 900


def _load_check() -> ModuleType:
    """pipelines/check.py: the demo's expected tables, worked out by hand."""
    spec = importlib.util.spec_from_file_location("demo_check", ROOT / "pipelines" / "check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK = _load_check()


def environment() -> dict[str, str]:
    """Driver, daemons and executors run this tree's autocdc with the venv's Python."""
    env = child_env()
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_HOME"] = str(SPARK_HOME)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_DAEMON_MEMORY"] = "256m"
    env["SPARK_DAEMON_JAVA_OPTS"] = JVM_OPTIONS
    return env


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the demo project (its spec puts the warehouse in ../warehouse, so beside
    the copy); returns the spec's path."""
    root = tmp_path_factory.mktemp("submit") / "demo"
    ignore = shutil.ignore_patterns("storage", "warehouse", "__pycache__")
    shutil.copytree(ROOT / "pipelines", root / "pipelines", ignore=ignore)
    # All change files in one micro-batch per flow (the demo has one per file): quicker,
    # and the answer must not change with the batching.
    feed = root / "pipelines" / "transformations" / "customers.py"
    batched = feed.read_text().replace('.option("maxFilesPerTrigger", 1)', "")
    assert batched != feed.read_text()
    feed.write_text(batched)
    return root / "pipelines" / "spark-pipeline.yml"


def submit(spec: Path, master: str, *options: str) -> None:
    """``spark-submit <launcher> run --spec SPEC --full-refresh-all`` from another folder,
    after removing any earlier run's tables and checkpoints, so what is checked next is
    this run's."""
    shutil.rmtree(spec.parent.parent / "warehouse", ignore_errors=True)
    shutil.rmtree(spec.parent / "storage", ignore_errors=True)
    env = environment()
    launcher = subprocess.run(
        [sys.executable, "-m", "autocdc", "launcher"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(launcher) == ROOT / "autocdc" / "__main__.py"
    command = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        *("--master", master, "--packages", DELTA, *SMALL, *options),
        launcher,
        *("run", "--spec", str(spec), "--full-refresh-all"),
    ]
    done = subprocess.run(
        command,
        env=env,
        cwd=spec.parent.parent.parent,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{error_tail(done.stderr, 40)}"


def check_tables(spark: SparkSession, warehouse: Path) -> None:
    """Every table of the demo, read by path, equals the hand-worked answer."""

    def table(name: str) -> DataFrame:
        return spark.read.format("delta").load(str(warehouse / name))

    current = table("customers").select("id", "name", "city").orderBy("id")
    assert [tuple(r) for r in current.collect()] == CHECK.CURRENT
    history = table("customers_history").orderBy("id", "__START_AT")
    columns = ["id", "name", "city", "__START_AT", "__END_AT"]
    assert [tuple(r) for r in history.select(*columns).collect()] == CHECK.HISTORY
    per_city = {r.city: r.customers for r in table("customers_per_city").collect()}
    assert per_city == collections.Counter(city for _, _, city in CHECK.CURRENT)
    for target in ("customers", "customers_history"):
        quarantine = table(f"{target}__autocdc_quarantine").collect()
        assert [(r.reason, json.loads(r.row)["name"]) for r in quarantine] == [
            ("AUTOCDC_NULL_KEY", "Ghost")
        ]


@pytest.mark.e2e
def test_spark_submit_local(spark: SparkSession, project: Path) -> None:
    submit(project, "local[2]")
    check_tables(spark, project.parent.parent / "warehouse")


@pytest.mark.e2e
def test_spark_submit_without_delta_says_what_to_add(project: Path) -> None:
    """No ``--packages`` for Delta: autocdc's one error line naming the option to add (exit
    status 2), not a Java trace about a missing catalog plugin class, and few of the
    launcher's INFO lines (it is kept to errors from when autocdc connects)."""
    env = environment()
    launcher = str(ROOT / "autocdc" / "__main__.py")
    command = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", "local[1]", *SMALL]
    done = subprocess.run(
        [*command, launcher, "dry-run", "--spec", str(project)],
        env=env,
        cwd=project.parent,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    # The launcher's output on stderr; the Python driver's, stderr too, on its stdout.
    assert done.returncode == 2, f"{done.stdout[-3000:]}\n{error_tail(done.stderr)}"
    assert done.stdout.startswith("autocdc: [AUTOCDC_DELTA_NOT_SUBMITTED] "), done.stdout
    assert f"--packages {DELTA}" in done.stdout and len(done.stdout.splitlines()) == 1
    said = done.stderr.splitlines()
    assert "Traceback" not in done.stderr and "DeltaCatalog" not in done.stderr
    assert sum(" INFO " in line for line in said) < 60, len(said)


@dataclass(frozen=True)
class Cluster:
    url: str
    webui: int

    def state(self) -> dict[str, Any]:
        """The master's JSON UI: workers, running and completed applications."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui}/json/", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> int:
        """0 also while the master is not up yet."""
        try:
            return sum(worker["state"] == "ALIVE" for worker in self.state()["workers"])
        except OSError:
            return 0


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Cluster]:
    """A standalone master and one worker (1 core, 1 GB) on 127.0.0.1, yielded once the
    worker has registered; both are stopped after (with the worker's executors)."""
    port, webui = free_port(), free_port()
    cluster = Cluster(f"spark://127.0.0.1:{port}", webui)
    spark_class, deploy = str(SPARK_HOME / "bin" / "spark-class"), "org.apache.spark.deploy"
    daemons = {
        "master": [
            *(spark_class, f"{deploy}.master.Master", "--host", "127.0.0.1"),
            *("--port", str(port), "--webui-port", str(webui)),
        ],
        "worker": [
            *(spark_class, f"{deploy}.worker.Worker", cluster.url),
            *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
            *("--webui-port", str(free_port())),
            *("--work-dir", str(tmp_path / "work")),  # executor logs, else under SPARK_HOME
        ],
    }
    started: dict[str, subprocess.Popen[bytes]] = {}

    def logs() -> str:
        texts = {name: (tmp_path / f"{name}.log").read_text() for name in started}
        return "\n".join(f"--- {name}\n{error_tail(text, 40)}" for name, text in texts.items())

    try:
        for name, command in daemons.items():
            with (tmp_path / f"{name}.log").open("wb") as log:
                # Own process group: stopping it stops the executors the worker started.
                started[name] = subprocess.Popen(
                    command, env=environment(), stdout=log, stderr=log, start_new_session=True
                )
        deadline = time.monotonic() + 120
        while cluster.alive_workers() < 1:
            exited = [name for name, p in started.items() if p.poll() is not None]
            assert not exited and time.monotonic() < deadline, f"no worker:\n{logs()}"
            time.sleep(1)
        yield cluster
    finally:
        for process in reversed(started.values()):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(started.values()):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.mark.e2e
def test_standalone_cluster(spark: SparkSession, project: Path, standalone: Cluster) -> None:
    """Client deploy mode: the driver here, the tasks in the worker's executor."""
    executor = (
        *("--conf", "spark.executor.memory=1g", "--conf", "spark.cores.max=1"),
        *("--conf", f"spark.executor.extraJavaOptions={JVM_OPTIONS}"),
    )
    submit(project, standalone.url, *executor)
    check_tables(spark, project.parent.parent / "warehouse")
    assert [app["state"] for app in standalone.state()["completedapps"]] == ["FINISHED"]
