"""A class-data-sharing archive of the classes a session loads, made once per virtualenv.

A JVM that starts a session and applies its first batches loads some 20,000 classes from
~300 jars, parsing and verifying each. Mapped from an archive instead, they take
seconds off every start: every ``autocdc run``, every job.

``python -m autocdc.engine.archive`` (``make setup``, after the jars) makes it: a session of
its own applies a few small batches (SCD type 1 and 2, in a streaming query), then its JVM
writes the classes it loaded to ``<venv>/share/autocdc/jars/autocdc-classes.jsa`` (the
``VM.cds dynamic_dump`` diagnostic command, JDK 17+). Sessions autocdc starts map it
(``-XX:SharedArchiveFile``). A JVM that finds it does not match (another Java, other jars)
says so in the log and loads its classes as usual; a marker file names the pyspark and
Delta versions it was made for, so an upgrade makes it again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from autocdc.engine import jars

ARCHIVE = "autocdc-classes.jsa"
MARKER = "autocdc-classes.json"
# Lets the running JVM write a dynamic archive when asked (costs nothing until then).
RECORD_OPTION = "-XX:+RecordDynamicDumpInfo"


class ArchiveError(Exception):
    """The JVM did not write the archive (a JRE without jcmd, a Java before 17)."""


def path() -> Path:
    return jars.jar_dir() / ARCHIVE


def _marker() -> dict | None:
    """What the last ``make`` was for, and whether it wrote an archive."""
    try:
        marker = json.loads((jars.jar_dir() / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _made(written: bool) -> dict:
    return {"pyspark": version("pyspark"), "jars": jars.coordinates(), "archive": written}


def usable() -> Path | None:
    """The archive, if it was made for today's pyspark and the session's jars."""
    return path() if _marker() == _made(True) and path().is_file() else None


def java_option() -> str | None:
    """The driver JVM option that maps the archive (None: there is none to map)."""
    found = usable()
    return f'"-XX:SharedArchiveFile={found}"' if found is not None else None


def make() -> Path:
    """Start a session that records what it loads, apply a few batches, dump the archive."""
    # Imported here: a session is what this module makes, not what importing it needs.
    from autocdc.engine.session import spark_session

    marker = jars.jar_dir() / MARKER
    marker.unlink(missing_ok=True)  # the session below must not map an old archive
    path().unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="autocdc-classes-") as scratch:
        root = Path(scratch)
        spark = spark_session(
            warehouse=root / "warehouse",
            conf={
                "spark.driver.extraJavaOptions": RECORD_OPTION,
                "autocdc.logFile": str(jars.jar_dir().parent / "classes-archive.log"),
            },
        )
        _workload(spark, root)
        try:
            _dump(spark, path())
        finally:
            spark.stop()
    marker.write_text(json.dumps(_made(True)))
    return path()


def _workload(spark, root: Path) -> None:
    """What a pipeline run does: a streaming query applies change files, SCD type 1 and 2."""
    from autocdc.engine.flow import AutoCdcFlow

    changes = root / "changes"
    changes.mkdir()
    rows = [
        '{"id": 1, "a": "x", "op": "U", "seq": 1}',
        '{"id": 2, "a": "y", "op": "U", "seq": 2}',
        '{"id": 1, "a": null, "op": "D", "seq": 3}',
    ]
    (changes / "1.json").write_text("\n".join(rows) + "\n")
    flows = [
        AutoCdcFlow(
            target=f"scd{scd}",
            keys=["id"],
            sequence_by="seq",
            apply_as_deletes="op = 'D'",
            except_column_list=["op", "seq"],
            stored_as_scd_type=scd,
        )
        for scd in (1, 2)
    ]

    def apply(batch, _batch_id: int) -> None:
        for flow in flows:
            flow.apply(batch)
        flows[0].apply(batch)  # a replay: the path of a batch that changes nothing

    stream = spark.readStream.schema("id INT, a STRING, op STRING, seq BIGINT").json(str(changes))
    query = (
        stream.writeStream.foreachBatch(apply)
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    for flow in flows:
        flow.current(spark).collect()


def _dump(spark, target: Path) -> None:
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


def main() -> int:
    """``python -m autocdc.engine.archive``: silent when a usable archive is there."""
    if usable() is not None or _marker() == _made(False):
        return 0  # made for these versions already (or this Java cannot make one)
    if jars.installed() is None:
        print("autocdc: run `python -m autocdc.engine.jars` first", file=sys.stderr)
        return 2
    print(f"autocdc: writing the class archive {path()}, once")
    try:
        made = make()
    except (ArchiveError, OSError) as error:  # a Java without jcmd or dynamic archives
        (jars.jar_dir() / MARKER).write_text(json.dumps(_made(False)))
        print(f"autocdc: no class archive, sessions start without one: {error}")
        return 0
    print(f"autocdc: class archive written ({made.stat().st_size // 2**20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
