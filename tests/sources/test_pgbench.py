"""pgbench's TPC-B-like load (every transaction updates an account, a teller and the
branch, and inserts a history row) captured live through one slot, at a small scale:
once the tables are loaded, pgbench writes for a few seconds; then every SCD type 1
target equals its table, the SCD type 2 history of the branch (a hot key: every
transaction changes it) is contiguous and ends at the table's row, and the balances
agree. The accounts are cut to 2,000 (the script draws from those) so the load stays
small. The large scale is a benchmark (benchmarks/pgbench.py)."""

from __future__ import annotations

import pytest
from pgbenchcase import differences, pgbench, run, stop, wait_until_caught_up, write_project
from pgserver import Server
from sparkconf import SMALL_SPARK

ACCOUNTS = 2000
# pgbench's built-in TPC-B-like script, its accounts drawn from the first ACCOUNTS.
SCRIPT = f"""\\set aid random(1, {ACCOUNTS})
\\set tid random(1, 10)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = 1;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime)
  VALUES (:tid, 1, :aid, :delta, CURRENT_TIMESTAMP);
END;
"""


@pytest.mark.e2e
def test_pgbench_captured_live_mirrors_the_tables(spark, tmp_path):
    server = Server().start()
    try:
        pgbench(server, "-i", "-q", "-s", "1")
        server.execute(f"DELETE FROM pgbench_accounts WHERE aid > {ACCOUNTS}")
        server.execute("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")
        script = tmp_path / "tpcb.sql"
        script.write_text(SCRIPT)
        spec = write_project(tmp_path / "project", SMALL_SPARK)
        log = tmp_path / "run.log"
        live = run(spec, server.dsn, log, "--continuous", "--trigger-interval", "2s")
        try:
            loaded = wait_until_caught_up(spark, spec, server, live, 300)
            output = pgbench(server, "-c", "2", "-j", "1", "-T", "5", "-n", "-f", str(script))
            lag = wait_until_caught_up(spark, spec, server, live, 300)
        finally:
            stop(live)
        assert float("inf") not in (loaded, lag), log.read_text()[-3000:]
        assert "number of transactions actually processed" in output
        assert differences(spark, spec, server) == []
    finally:
        server.stop()
