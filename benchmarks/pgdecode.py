"""The PostgreSQL slot reader's Python work per change, paired with another revision's.

A throwaway server runs ``pgbench -t N`` into a slot; its pgoutput messages are peeked
once, then each revision's reader turns the same messages into what Spark receives:
its change rows, and their conversion to Arrow as Spark does it (this checkout's reader
hands Spark record batches; tuples are converted by Spark's Python worker, row by row).
Both must give the same change rows. Alternating order, three rounds, median ratio.

    python benchmarks/pgdecode.py --base main --transactions 5000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ab import export_engine
from pyspark.sql.types import LongType, StringType, StructField, StructType
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from pgbenchcase import TABLES, pgbench
from pgserver import Server

from autocdc.sources import pgchanges
from autocdc.sources import postgres as pgs

COLUMNS = ("table", "_CHANGE_TYPE", "_CHANGE_SEQUENCE_NUMBER", "data", "lsn", "xid")
ROW_TYPE = StructType(
    [StructField(c, LongType() if c == "xid" else StringType()) for c in COLUMNS]
    + [StructField("_corrupt_record", StringType())]
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    parser.add_argument("--transactions", type=int, default=5000, help="per pgbench client")
    args = parser.parse_args(argv)
    base = export_engine(args.base, Path(tempfile.mkdtemp(prefix="autocdc-pgdecode-")))
    server = Server().start()
    try:
        pgbench(server, "-i", "-q", "-s", "1")
        server.execute("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")
        tables = ",".join(TABLES)
        server.execute(f"CREATE PUBLICATION p FOR TABLE {tables}")
        server.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        pgbench(server, "-c", "4", "-j", "2", "-t", str(args.transactions), "-n")
        cfg = pgs.Config.parse(
            {"dsn": server.dsn, "tables": tables, "slot": "s", "publication": "p"}
        )
        with pgs.connect(server.dsn) as conn:
            end = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
            started = time.perf_counter()
            messages = list(pgs._peek(conn, cfg, end))
            peek = time.perf_counter() - started
        print(
            f"peek (the server's decoding and the transfer): {len(messages):,} messages "
            f"in {peek:.2f} s",
            flush=True,
        )
        upto = pgs.pg.parse_lsn(end) + 1

        def rows(module) -> list:
            decoder = module.ChangeDecoder(dict(cfg.keys), 0, upto)
            return [r for lsn, data in messages for r in decoder.feed(lsn, data)]

        same = rows(pgchanges) == rows(base.sources.pgchanges)
        print(f"same change rows: {same}", flush=True)
        if not same:
            return 1

        def new() -> int:
            decoder = pgchanges.ChangeDecoder(dict(cfg.keys), 0, upto)
            fed = (r for lsn, data in messages for r in decoder.feed(lsn, data))
            return sum(b.num_rows for b in pgchanges.arrow_batches(fed))

        def old() -> int:
            decoder = base.sources.pgchanges.ChangeDecoder(dict(cfg.keys), 0, upto)
            fed = (r for lsn, data in messages for r in decoder.feed(lsn, data))
            source = pgs.PostgresSource({})
            return sum(b.num_rows for b in records_to_arrow_batches(fed, 10_000, ROW_TYPE, source))

        ratios = []
        for i in range(3):
            order: list[tuple[str, Callable[[], int]]] = [("base", old), ("new", new)]
            took: dict[str, float] = {}
            for name, work in order if i % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                count = work()
                took[name] = time.perf_counter() - started
            ratios.append(took["new"] / took["base"])
            print(
                f"round {i}: base {took['base']:.2f} s ({count / took['base']:,.0f} rows/s), "
                f"new {took['new']:.2f} s ({count / took['new']:,.0f} rows/s), "
                f"new/base {ratios[-1]:.3f}",
                flush=True,
            )
        print(f"median new/base {statistics.median(ratios):.3f}", flush=True)
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
