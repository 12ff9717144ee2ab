"""pgbench's scenario, shared by its benchmark (benchmarks/pgbench.py) and its end-to-end
test: the server's tables (``pgbench -i``, with a key added to ``pgbench_history``), a
pipeline project capturing the four through one slot (SCD type 1 targets, and an SCD
type 2 history of ``pgbench_branches``), runs of it, and checks of its targets against
the tables, read by path with a Spark session of the caller's (the targets have deletion
vectors, which ``deltalake`` does not read)."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from pgserver import Server
from projects import write_spec
from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]
TABLES = {  # table: (key, schema as the flow types it)
    "pgbench_accounts": ("aid", "aid INT, bid INT, abalance INT, filler STRING"),
    "pgbench_branches": ("bid", "bid INT, bbalance INT, filler STRING"),
    "pgbench_tellers": ("tid", "tid INT, bid INT, tbalance INT, filler STRING"),
    "pgbench_history": (
        "hid",
        "hid BIGINT, tid INT, bid INT, aid INT, delta INT, mtime TIMESTAMP_NTZ, filler STRING",
    ),
}
HISTORY = "pgbench_branches_history"
CHANGES_PER_TRANSACTION = 4  # three updates and an insert

DEFINITIONS = '''
"""pgbench's four tables through one slot; pgbench_branches also as SCD type 2."""

import os

from autocdc import pipelines as dp
from autocdc import postgres_table

DSN = os.environ["AUTOCDC_POSTGRES_DSN"]
TABLES = {tables!r}


@dp.table
def pgbench_changes():
    return (
        spark.readStream.format("postgres_cdc")  # noqa: F821
        .option("dsn", DSN)
        .option("slot", "autocdc_pgbench")
        .option("tables", ",".join(TABLES))
        .load()
    )


for table, (key, schema) in TABLES.items():
    dp.temporary_view(name=f"{{table}}_changes")(
        lambda table=table, schema=schema: postgres_table(
            spark.readStream.table("pgbench_changes"), table, schema  # noqa: F821
        )
    )
    dp.create_streaming_table(table)
    dp.create_auto_cdc_flow(target=table, source=f"{{table}}_changes", keys=[key])

dp.create_streaming_table("{history}")
dp.create_auto_cdc_flow(
    target="{history}", source="pgbench_branches_changes", keys=["bid"], stored_as_scd_type=2
)
'''


def pgbench_bin() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))
    if not found:
        raise RuntimeError("pgbench not found (apt-get install postgresql)")
    return found[-1]


def pgbench(server: Server, *args: str) -> str:
    command = [pgbench_bin(), "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"]
    done = subprocess.run(
        [*command, *args, "postgres"], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"pgbench {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout + done.stderr


def transactions(output: str) -> int:
    found = re.search(r"number of transactions actually processed: (\d+)", output)
    return int(found.group(1)) if found else 0


def write_project(root: Path, conf: dict[str, str]) -> Path:
    (root / "transformations").mkdir(parents=True)
    spec = write_spec(root, "pgbench", None, {"spark.sql.warehouse.dir": "warehouse", **conf})
    text = DEFINITIONS.format(tables=TABLES, history=HISTORY)
    (root / "transformations" / "pgbench.py").write_text(textwrap.dedent(text))
    return spec


def run(spec: Path, dsn: str, log: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "AUTOCDC_POSTGRES_DSN": dsn}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    out = log.open("a")
    return subprocess.Popen(
        [sys.executable, "-m", "autocdc", "run", "--spec", str(spec), *args],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=spec.parent,
    )


def target(
    spark: SparkSession, spec: Path, name: str, columns: list[str] | None = None
) -> Any | None:
    """The target's rows (a pyarrow table, of ``columns`` if given), or None before its
    first commit."""
    path = spec.parent / "warehouse" / name
    try:
        df = spark.read.format("delta").load(str(path))
        return (df.select(*columns) if columns else df).toArrow()
    except Exception:  # not created yet, or mid-creation
        return None


def signature_of_tables(server: Server) -> dict[str, Any]:
    (row,) = server.query(
        "SELECT (SELECT sum(abalance) FROM pgbench_accounts), "
        "(SELECT sum(tbalance) FROM pgbench_tellers), "
        "(SELECT sum(bbalance) FROM pgbench_branches), "
        "(SELECT count(*) FROM pgbench_history), "
        "(SELECT coalesce(max(hid), 0) FROM pgbench_history), "
        "(SELECT count(*) FROM pgbench_accounts), (SELECT count(*) FROM pgbench_tellers), "
        "(SELECT count(*) FROM pgbench_branches)"
    )
    names = (
        "abalance",
        "tbalance",
        "bbalance",
        "history",
        "hid",
        "accounts",
        "tellers",
        "branches",
    )
    return dict(zip(names, map(int, row), strict=True))


def signature_of_targets(spark: SparkSession, spec: Path) -> dict[str, Any] | None:
    read = {
        "pgbench_accounts": ["abalance"],
        "pgbench_tellers": ["tbalance"],
        "pgbench_branches": ["bbalance"],
        "pgbench_history": ["hid"],
        HISTORY: ["bbalance", "__END_AT"],
    }
    tables = {name: target(spark, spec, name, columns) for name, columns in read.items()}
    if any(t is None for t in tables.values()):
        return None
    current = tables[HISTORY].filter(pc.is_null(tables[HISTORY]["__END_AT"]))

    def total(table: Any, column: str) -> int:
        return int(pc.sum(table[column]).as_py() or 0)

    history = tables["pgbench_history"]
    return {
        "abalance": total(tables["pgbench_accounts"], "abalance"),
        "tbalance": total(tables["pgbench_tellers"], "tbalance"),
        "bbalance": total(tables["pgbench_branches"], "bbalance"),
        "history": history.num_rows,
        "hid": int(pc.max(history["hid"]).as_py() or 0) if history.num_rows else 0,
        "accounts": tables["pgbench_accounts"].num_rows,
        "tellers": tables["pgbench_tellers"].num_rows,
        "branches": tables["pgbench_branches"].num_rows,
        "current_bbalance": total(current, "bbalance"),
    }


def caught_up(expected: dict[str, Any], got: dict[str, Any] | None) -> bool:
    if got is None:
        return False
    same = all(got[k] == v for k, v in expected.items())
    return same and got["current_bbalance"] == expected["bbalance"]


def wait_until_caught_up(
    spark: SparkSession, spec: Path, server: Server, proc: subprocess.Popen, limit: float
) -> float:
    """Seconds until the targets hold the database's state (it no longer changes)."""
    expected = signature_of_tables(server)
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"the continuous run ended ({proc.returncode}): see its log")
        if caught_up(expected, signature_of_targets(spark, spec)):
            return time.monotonic() - started
        time.sleep(1.0)
    return float("inf")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def differences(spark: SparkSession, spec: Path, server: Server) -> list[str]:
    """What differs between the targets and the tables (empty: nothing)."""
    problems = []
    for table, (_, schema) in TABLES.items():
        columns = [c.split()[0] for c in schema.split(", ")]
        rows = server.query(f"SELECT {', '.join(columns)} FROM {table}")
        got = target(spark, spec, table)
        held = set(zip(*[got[c].to_pylist() for c in columns], strict=True)) if got else set()
        if held != set(rows):
            problems.append(
                f"{table}: {len(held ^ set(rows))} rows differ ({len(rows)} in the table)"
            )
    versions = target(spark, spec, HISTORY)
    by_key: dict[int, list[tuple]] = {}
    for bid, balance, start, end in zip(
        *[versions[c].to_pylist() for c in ("bid", "bbalance", "__START_AT", "__END_AT")],
        strict=True,
    ):
        by_key.setdefault(bid, []).append((_order(start), balance, _order(end)))
    branches = dict(server.query("SELECT bid, bbalance FROM pgbench_branches"))
    for bid, held in by_key.items():
        held.sort()
        ends = [v[2] for v in held[:-1]]
        if ends != [v[0] for v in held[1:]] or held[-1][2] is not None:
            problems.append(f"{HISTORY}: key {bid}'s versions are not contiguous")
        if held[-1][1] != branches.get(bid):
            problems.append(f"{HISTORY}: key {bid}'s current version is not the table's row")
    sums = signature_of_targets(spark, spec) or {}
    if not sums.get("abalance") == sums.get("bbalance") == sums.get("tbalance"):
        problems.append(f"balances differ: {sums}")
    return problems


def _order(value: Any) -> Any:
    """A hex sequence (a struct of sections) as a tuple, so versions sort by it."""
    return None if value is None else tuple(value.values()) if isinstance(value, dict) else value


def applied_seconds(log: Path, since: int) -> dict[str, float]:
    """Each flow's summed batch seconds in the run log, from byte ``since`` on."""
    seconds: dict[str, float] = {}
    text = log.read_text()[since:]
    for flow, took in re.findall(r"flow (\S+): read [^;]*; ([\d.]+) s \(commit", text):
        seconds[flow] = seconds.get(flow, 0.0) + float(took)
    return seconds
