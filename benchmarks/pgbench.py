"""PostgreSQL capture under pgbench's write load (TPC-B-like), end to end.

A throwaway server (the tests' helper) is initialized with ``pgbench -i -s SCALE`` (and a
``bigserial`` key added to ``pgbench_history``, which has none). One ``postgres_cdc``
source captures the four tables through one slot into a change table; each table's flow
applies its rows to an SCD type 1 target, and ``pgbench_branches`` also to an SCD type 2
history (three keys, each updated by every transaction: hot keys). Then:

1. **live**: ``autocdc run --continuous`` loads the tables and keeps capturing while
   ``pgbench -c CLIENTS -j JOBS -T SECONDS -n`` runs; the lag is the time from pgbench's
   end until every target holds the database's final state.
2. **catch-up**: the run is stopped, pgbench writes again for ``--catchup-seconds`` with
   nothing capturing, and one plain ``autocdc run`` takes everything since: its wall time
   (JVM start included) and the changes per second it applied.
3. **check**: every SCD type 1 target equals its table, the SCD type 2 history is
   contiguous and its current versions equal ``pgbench_branches``, and
   sum(abalance) = sum(bbalance) = sum(tbalance) in the targets.

The targets are read by a Spark session of the benchmark's own (one core), polled every
second while waiting. Prints one line per figure and exits non-zero when a check fails.

    python benchmarks/pgbench.py                             # -s 3, 150 s live, 150 s stopped
    python benchmarks/pgbench.py --scale 1 --seconds 20 --catchup-seconds 20   # a quick look
    python benchmarks/pgbench.py --rate 500          # a paced write load: does the capture keep up?
    python benchmarks/pgbench.py --kills 2           # SIGKILL the live run twice, restarted at once
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from pgbenchcase import (
    CHANGES_PER_TRANSACTION,
    applied_seconds,
    differences,
    pgbench,
    run,
    stop,
    transactions,
    wait_until_caught_up,
    write_project,
)
from pgserver import Server

import autocdc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=150, help="pgbench while capturing")
    parser.add_argument("--catchup-seconds", type=int, default=150, help="pgbench, stopped")
    parser.add_argument(
        "--rate",
        type=int,
        help="transactions a second while capturing (pgbench -R); full speed if unset",
    )
    parser.add_argument("--trigger-interval", default="5s")
    parser.add_argument(
        "--kills",
        type=int,
        default=0,
        help="SIGKILL the continuous run this many times while pgbench writes (evenly spread), "
        "each time starting it again at once",
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "autocdc-pgb")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
    server = Server().start()
    checker = {"spark.master": "local[1]", "spark.sql.shuffle.partitions": "1"}
    spark = autocdc.spark_session(warehouse=args.work / "checker", conf=checker)
    figures: dict[str, Any] = {"scale": args.scale, "clients": args.clients, "rate": args.rate}
    try:
        pgbench(server, "-i", "-q", "-s", str(args.scale))
        server.execute("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")
        spec = write_project(args.work / "project", {"spark.master": args.master})
        log = args.work / "run.log"

        started = time.monotonic()
        live = run(
            spec, server.dsn, log, "--continuous", "--trigger-interval", args.trigger_interval
        )
        loaded = wait_until_caught_up(spark, spec, server, live, 600)
        figures["initial_load_s"] = round(time.monotonic() - started, 1)
        print(
            f"initial load of {args.scale * 100_000:,} accounts: {figures['initial_load_s']} s "
            "(JVM start included)",
            flush=True,
        )
        if loaded == float("inf"):
            raise SystemExit("the initial load did not finish in 10 minutes")
        mark = log.stat().st_size
        paced = ["-R", str(args.rate)] if args.rate else []
        holder, kills = [live], []
        restart = [spec, server.dsn, log, "--continuous", "--trigger-interval"]
        restart.append(args.trigger_interval)
        spacing = args.seconds / (args.kills + 1)
        timers = [
            threading.Timer(spacing * (i + 1), _kill, (holder, restart, kills))
            for i in range(args.kills)
        ]
        for timer in timers:
            timer.start()
        bench = pgbench(
            server,
            *("-c", str(args.clients), "-j", str(args.jobs), "-T", str(args.seconds), "-n"),
            *paced,
        )
        for timer in timers:
            timer.join()
        live = holder[0]
        done = transactions(bench)
        figures["kills"] = kills
        figures["live_changes"] = done * CHANGES_PER_TRANSACTION
        figures["live_changes_per_s_written"] = round(figures["live_changes"] / args.seconds)
        lag = wait_until_caught_up(spark, spec, server, live, 1800)
        figures["lag_at_end_s"] = round(lag, 1)
        print(
            f"live: pgbench {done:,} transactions ({figures['live_changes']:,} changes, "
            f"{figures['live_changes_per_s_written']:,}/s) in {args.seconds} s; lag at its "
            f"end {figures['lag_at_end_s']} s",
            flush=True,
        )
        print(f"    applied seconds per flow: {applied_seconds(log, mark)}", flush=True)
        stop(live)

        bench = pgbench(
            server,
            "-c",
            str(args.clients),
            "-j",
            str(args.jobs),
            "-T",
            str(args.catchup_seconds),
            "-n",
        )
        backlog = transactions(bench) * CHANGES_PER_TRANSACTION
        mark = log.stat().st_size
        started = time.monotonic()
        plain = run(spec, server.dsn, log)
        plain.wait()
        took = time.monotonic() - started
        if plain.returncode:
            raise SystemExit(f"the catch-up run failed ({plain.returncode}): see {log}")
        figures |= {
            "catchup_changes": backlog,
            "catchup_s": round(took, 1),
            "catchup_changes_per_s": round(backlog / took),
        }
        per_flow = applied_seconds(log, mark)
        print(
            f"catch-up: {backlog:,} changes in {took:.1f} s ({backlog / took:,.0f}/s, JVM "
            f"start included); applied seconds per flow: {per_flow}",
            flush=True,
        )
        if 1_000_000 > backlog > 0:
            print(f"    at that rate 1M changes: {1_000_000 * took / backlog:.0f} s", flush=True)

        problems = differences(spark, spec, server)
        figures["checks"] = problems or "targets equal the tables; balances agree"
        print(f"check: {figures['checks']}", flush=True)
        print(json.dumps(figures), flush=True)
        return 1 if problems else 0
    finally:
        server.stop()


def _kill(holder: list[subprocess.Popen], restart: list, kills: list[str]) -> None:
    """SIGKILL the live run (as a node failure would) and start it again at once."""
    holder[0].send_signal(signal.SIGKILL)
    holder[0].wait()
    holder[0] = run(*restart)
    kills.append(time.strftime("%H:%M:%S"))
    print(f"    killed the live run (SIGKILL) and started it again at {kills[-1]}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
