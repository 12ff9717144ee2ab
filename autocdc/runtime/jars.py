"""The jars every session carries, resolved once into the virtualenv so that sessions start
from files: Delta Lake's, Spark's Kafka connector (``format("kafka")``, which pyspark's
wheel lacks: Debezium's changes mostly arrive through Kafka), and the JDBC drivers
extraction sources read with (:data:`JDBC_DRIVERS`).

Without them every session start resolves ``io.delta:delta-spark_...`` with ivy (through
delta-spark's ``configure_spark_with_delta_pip``): ~150 lines of output and seconds of
work per start, and network access. ``python -m autocdc.runtime.jars`` (run by
``make setup``) lets Spark's own ivy resolution run once, into a scratch ivy home, and
copies the jars it retrieved to ``<venv>/share/autocdc/jars/``; a marker file names the
coordinates they belong to, so an upgraded delta-spark or pyspark resolves again.
Running it again is a no-op.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

from pyspark.find_spark_home import _find_spark_home

from autocdc.runtime.errors import AutoCdcError, JarsUnresolvedError

MARKER = "autocdc-jars.json"
KAFKA_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"
JDBC_DRIVERS = (  # autocdc.sources.jdbcextract.DRIVERS names their classes
    "org.postgresql:postgresql:42.7.14",
    "org.mariadb.jdbc:mariadb-java-client:3.5.11",
    "org.xerial:sqlite-jdbc:3.54.1.0",
)


def coordinate() -> str:
    """Delta's Maven coordinate for the installed delta-spark and pyspark, built as
    delta-spark's ``configure_spark_with_delta_pip`` builds it."""
    spark = ".".join(version("pyspark").split(".")[:2])
    return f"io.delta:delta-spark_{spark}_2.13:{version('delta-spark')}"


def kafka_coordinate() -> str:
    """Spark's Kafka connector, of the installed pyspark's version (it must match)."""
    return f"{KAFKA_ARTIFACT}:{version('pyspark')}"


def coordinates() -> list[str]:
    """Every coordinate a session carries: Delta's, Spark's Kafka connector, the drivers."""
    return [coordinate(), kafka_coordinate(), *JDBC_DRIVERS]


def jar_dir() -> Path:
    """Where the jars live: inside the virtualenv, so they go away with it."""
    return Path(sys.prefix) / "share" / "autocdc" / "jars"


def installed(folder: Path | None = None, wanted: list[str] | None = None) -> list[Path] | None:
    """The jars in ``folder`` if they were resolved for ``wanted`` (default: today's
    ``coordinates()``) and are all there, else None (then a session resolves them with ivy
    at start)."""
    folder, wanted = folder or jar_dir(), wanted or coordinates()
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("coordinates") != wanted:
        return None
    jars = [folder / name for name in marker.get("jars", [])]
    return jars if jars and all(jar.is_file() for jar in jars) else None


def install(folder: Path | None = None, wanted: list[str] | None = None) -> list[Path]:
    """Resolve ``wanted`` (default: the session's ``coordinates()``) into ``folder`` unless
    they are there already; return the jars. Other JVMs (the tests' Kafka broker) take
    their jars from Maven Central the same way."""
    folder, wanted = folder or jar_dir(), wanted or coordinates()
    found = installed(folder, wanted)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    with _exclusive(folder.parent / f"{folder.name}.lock"):
        found = installed(folder, wanted)  # resolved by another process while this one waited
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix="autocdc-ivy-") as scratch:
            log = folder.parent / f"{folder.name}-resolution.log"
            resolved = _resolve(Path(scratch), log, wanted)
            for old in folder.glob("*.jar"):
                old.unlink()
            for jar in resolved:
                shutil.copy2(jar, folder / jar.name)
        marker = {"coordinates": wanted, "jars": [jar.name for jar in resolved]}
        partial = folder / f"{MARKER}.partial"
        partial.write_text(json.dumps(marker, indent=2) + "\n")
        partial.replace(folder / MARKER)  # the marker lands last: a killed copy resolves again
    return [folder / jar.name for jar in resolved]


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block. Two processes
    installing one folder at once (two test workers starting Kafka brokers) would otherwise
    both resolve, and the later one deletes the jars the earlier one's JVM is loading."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _resolve(ivy: Path, log: Path, wanted: list[str]) -> list[Path]:
    """Let spark-submit resolve the coordinates into the ivy home ``ivy`` (the same
    resolution, repositories and exclusions as ``--packages`` at a session start), running
    an empty script; ivy retrieves the jars into ``ivy/jars``. Output goes to ``log``."""
    script = ivy / "noop.py"
    script.write_text("")
    command = [
        str(Path(_find_spark_home()) / "bin" / "spark-submit"),
        "--packages",
        ",".join(wanted),
        "--conf",
        f"spark.jars.ivy={ivy}",
        "--conf",
        "spark.ui.enabled=false",
        str(script),
    ]
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with log.open("wb") as out:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=environment
        )
    jars = sorted((ivy / "jars").glob("*.jar"))
    if done.returncode != 0 or not jars:
        raise JarsUnresolvedError(coordinate=", ".join(wanted), code=done.returncode, log=log)
    return jars


def main() -> int:
    """``python -m autocdc.runtime.jars``: silent when the jars are there already."""
    if installed() is not None:
        return 0
    print(f"autocdc: resolving {', '.join(coordinates())} into {jar_dir()}, once")
    try:
        jars = install()
    except AutoCdcError as error:
        print(f"autocdc: {error}", file=sys.stderr)
        return 2
    print(f"autocdc: {len(jars)} jars installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
