"""Making the class archive (:mod:`autocdc.runtime.archive`): a session of its own runs a
workload, then its JVM writes the classes it loaded to the archive (the ``VM.cds
dynamic_dump`` diagnostic command, JDK 17+).

The workload is the caller's: what a pipeline run does is the engine's to say, and the
engine sits above this layer (``python -m autocdc.engine.warmup``, run by ``make setup``,
passes its own).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import SparkSession

from autocdc.runtime import archive, jars
from autocdc.runtime.session import spark_session

# Lets the running JVM write a dynamic archive when asked (costs nothing until then).
RECORD_OPTION = "-XX:+RecordDynamicDumpInfo"

# Runs in the recording session, given a scratch folder: the classes it loads are archived.
Workload = Callable[[SparkSession, Path], None]


class ArchiveError(Exception):
    """The JVM did not write the archive (a JRE without jcmd, a Java before 17)."""


def make(workload: Workload) -> Path:
    """Start a session that records what it loads, run ``workload``, dump the archive."""
    marker = jars.jar_dir() / archive.MARKER
    marker.unlink(missing_ok=True)  # the session below must not map an old archive
    archive.path().unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="autocdc-classes-") as scratch:
        root = Path(scratch)
        spark = spark_session(
            warehouse=root / "warehouse",
            conf={
                "spark.driver.extraJavaOptions": RECORD_OPTION,
                "autocdc.logFile": str(jars.jar_dir().parent / "classes-archive.log"),
            },
        )
        workload(spark, root)
        try:
            _dump(spark, archive.path())
        finally:
            spark.stop()
    marker.write_text(json.dumps(archive.marker_for(True)))
    return archive.path()


def _dump(spark: SparkSession, target: Path) -> None:
    """``jcmd <pid> VM.cds dynamic_dump <target>`` on the session's JVM."""
    system = spark._jvm.java.lang.System
    jcmd = Path(system.getProperty("java.home")) / "bin" / "jcmd"
    pid = str(spark._jvm.java.lang.ProcessHandle.current().pid())
    done = subprocess.run(
        [str(jcmd), pid, "VM.cds", "dynamic_dump", str(target)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or not target.is_file():
        raise ArchiveError(done.stdout + done.stderr)


def main(workload: Workload) -> int:
    """Make the archive with ``workload`` unless there is one for these versions: silent
    then."""
    if archive.usable() is not None or archive.read_marker() == archive.marker_for(False):
        return 0  # made for these versions already (or this Java cannot make one)
    if jars.installed() is None:
        print("autocdc: run `python -m autocdc.runtime.jars` first", file=sys.stderr)
        return 2
    print(f"autocdc: writing the class archive {archive.path()}, once")
    try:
        made = make(workload)
    except (ArchiveError, OSError) as error:  # a Java without jcmd or dynamic archives
        (jars.jar_dir() / archive.MARKER).write_text(json.dumps(archive.marker_for(False)))
        print(f"autocdc: no class archive, sessions start without one: {error}")
        return 0
    print(f"autocdc: class archive written ({made.stat().st_size // 2**20} MiB)")
    return 0
