"""The PostgreSQL example pipeline (pipelines/postgres) against a real server, end to end:
concurrent writers run random INSERT/UPDATE/DELETE/TRUNCATE traffic while `autocdc run`
loads 3,000 rows in batches of 100, is killed with SIGKILL twice at random moments of that
initial load, and is restarted each time with no manual step. Then every SCD type 1
target equals `SELECT *` of its table, and the SCD type 2 history of `items` is exactly
the committed order of its changes (recorded by a trigger), also after a replay of the
history from an LSN."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
import yaml
from chispa import assert_df_equality
from pgserver import Server
from processes import ROOT, child_env
from sparkconf import SUBPROCESS_CONF

from autocdc.sources.pgoutput import parse_lsn
from autocdc.sources.postgres import RESTARTED

EXAMPLE = ROOT / "pipelines" / "postgres"
SEED = int(os.environ.get("AUTOCDC_CRASH_SEED", "7"))
CUSTOMERS = "id BIGINT, name STRING, city STRING"
ITEMS = "id BIGINT, sku STRING, quantity INT, price DECIMAL(10,2)"

SCHEMA = """
CREATE TABLE customers (id bigint PRIMARY KEY, name text, city text);
CREATE TABLE items (id bigint PRIMARY KEY, sku text, quantity int, price numeric(10,2));
-- Every change to items in the order each row saw it: row locks make that the commit
-- order per key (a second writer of a row waits for the first to commit).
CREATE TABLE audit (n bigserial PRIMARY KEY, id bigint, op text, sku text, quantity int);
CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN INSERT INTO audit (id, op) VALUES (OLD.id, 'D');
  ELSE INSERT INTO audit (id, op, sku, quantity) VALUES (NEW.id, 'U', NEW.sku, NEW.quantity);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON items
  FOR EACH ROW EXECUTE FUNCTION audit();
INSERT INTO customers SELECT g, 'c' || g, 'city' || g % 3 FROM generate_series(1, 1500) g;
INSERT INTO items SELECT g, 'init-' || g, g, g FROM generate_series(1, 1500) g;
"""


def _write(dsn: str, writer: int, stop: threading.Event, errors: list) -> None:
    """Random small transactions until stopped; unique skus make every version distinct."""
    rng = random.Random(SEED * 100 + writer)
    n = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            n += 1
            # Keys behind, inside and ahead of the initial load's ranges, and new ones.
            key, sku = rng.randint(1, 1600), f"w{writer}-{n}"
            statements = {
                "insert item": ("INSERT INTO items VALUES (%s, %s, %s, %s)", (key, sku, n, n)),
                "update item": (
                    "UPDATE items SET sku = %s, quantity = quantity + 1 WHERE id = %s",
                    (sku, key),
                ),
                "delete item": ("DELETE FROM items WHERE id = %s", (key,)),
                "upsert customer": (
                    "INSERT INTO customers VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
                    "SET name = EXCLUDED.name, city = EXCLUDED.city",
                    (key, sku, f"city{n % 5}"),
                ),
                "delete customer": ("DELETE FROM customers WHERE id = %s", (key,)),
            }
            try:
                with conn.transaction():
                    for _ in range(rng.randint(1, 3)):
                        sql, params = statements[rng.choice(list(statements))]
                        conn.execute(sql, params)
                    if rng.random() < 0.0005:
                        conn.execute("TRUNCATE customers")
            except (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected):
                pass
            except Exception as error:  # reported by the test
                errors.append(error)
                return
            time.sleep(rng.uniform(0.02, 0.06))


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "postgres"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("storage", "warehouse"))
    shop = project / "transformations" / "shop.py"
    tables = '.option("tables", ",".join(SCHEMAS))'
    assert tables in shop.read_text()
    shop.write_text(shop.read_text().replace(tables, f'{tables}.option("load_batch_rows", 100)'))
    spec = project / "spark-pipeline.yml"
    settings = yaml.safe_load(spec.read_text())
    settings["configuration"].update(SUBPROCESS_CONF)
    spec.write_text(yaml.safe_dump(settings))
    return spec


def _offsets(spec: Path) -> Path:
    return spec.parent / "storage" / "checkpoints" / "shop_changes" / "offsets"


def _run(spec: Path, dsn: str, kill_at: tuple[int, float] | None = None, *options: str) -> int:
    """One `autocdc run` (with ``options``); ``kill_at=(n, seconds)``: SIGKILL that long
    after the slot's query planned its batch ``n`` (its offset is written before the batch
    runs)."""
    env = {**child_env(), "AUTOCDC_POSTGRES_DSN": dsn}
    log = spec.parent / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autocdc", "run", "--spec", str(spec), *options],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        while kill_at is not None and proc.poll() is None:
            if (_offsets(spec) / str(kill_at[0])).exists():
                time.sleep(kill_at[1])
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.1)
        proc.wait(timeout=600)
    assert proc.returncode in (0, -signal.SIGKILL), log.read_text()[-3000:]
    return proc.returncode


def _status(spec: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "autocdc", "status", "--spec", str(spec), "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(done.stdout)


def _loading(spec: Path) -> bool:
    """Whether the newest planned batch of the slot's query is one of the initial load."""
    planned = [f for f in _offsets(spec).iterdir() if f.name.isdigit()]
    newest = max(planned, key=lambda f: int(f.name))
    return '"load"' in newest.read_text().splitlines()[-1]


Version = tuple[str, int, bool]  # sku, quantity, still current


def _versions(rows) -> dict[int, list[Version]]:
    found: dict[int, list[Version]] = {}
    for row in sorted(rows, key=lambda r: (r.id, r["__START_AT"])):
        found.setdefault(row.id, []).append((row.sku, row.quantity, row["__END_AT"] is None))
    return found


def _committed_history(server: Server) -> dict[int, list[Version]]:
    """Each key's versions in commit order."""
    history: dict[int, list[Version]] = {}
    for key, op, sku, quantity in server.query(
        "SELECT id, op, sku, quantity FROM audit ORDER BY n"
    ):
        versions = history.setdefault(key, [])
        if versions and versions[-1][2]:
            versions[-1] = (*versions[-1][:2], False)
        if op == "U":
            versions.append((sku, quantity, True))
    return history


@pytest.mark.e2e
def test_capture_killed_mid_traffic_mirrors_the_database(spark, tmp_path):
    server = Server().start()
    try:
        server.execute(SCHEMA)
        spec = _project(tmp_path)
        stop, errors = threading.Event(), []
        writers = [
            threading.Thread(target=_write, args=(server.dsn, w, stop, errors)) for w in (1, 2)
        ]
        for writer in writers:
            writer.start()
        # Killed twice in the initial load, with writes going on (they delete and truncate
        # too, but the rows left make more than 10 batches of 100), then a restart
        # finishes it and streams, and a last run catches up.
        kills = random.Random(SEED)
        first = kills.randint(1, 3)
        story = [_run(spec, server.dsn, kill_at=(first, kills.uniform(0, 2)))]
        assert _loading(spec)
        second = first + kills.randint(1, 2)
        story.append(_run(spec, server.dsn, kill_at=(second, kills.uniform(0, 2))))
        assert _loading(spec)
        story.append(_run(spec, server.dsn))
        stop.set()
        for writer in writers:
            writer.join()
        assert not errors, errors
        story.append(_run(spec, server.dsn))
        assert story == [-signal.SIGKILL, -signal.SIGKILL, 0, 0]

        warehouse = spec.parent / "warehouse"
        for table, schema in (("customers", CUSTOMERS), ("items", ITEMS)):
            columns = ", ".join(f.split()[0] for f in schema.split(", "))
            expected = spark.createDataFrame(server.query(f"SELECT {columns} FROM {table}"), schema)
            got = spark.read.format("delta").load(str(warehouse / table))
            assert_df_equality(
                got, expected, ignore_row_order=True, ignore_nullable=True, ignore_metadata=True
            )
        history = _versions(
            spark.read.format("delta").load(str(warehouse / "items_history")).collect()
        )
        committed = _committed_history(server)
        # The history starts at the initial load's snapshot, so each key's versions are
        # the end of its committed history: exactly, in order, nothing doubled.
        for key, versions in history.items():
            ends = [committed[key][i:] for i in range(len(committed[key]))]
            assert versions in ends, (key, versions, committed[key])
        current = {k for k, v in committed.items() if v and v[-1][2]}
        assert {k for k, v in history.items() if v[-1][2]} == current
        # The kills came during the load of items (customers, first, may have been small
        # enough for the first batch: the writers truncate it now and then): what the
        # restarts loaded went by watermarks, and status says so.
        (changes,) = [f for f in _status(spec)["flows"] if f["flow"] == "shop_changes"]
        watermarked = changes["load_by_watermarks"]
        assert watermarked["public.items"] == RESTARTED
        assert set(watermarked) <= {"public.customers", "public.items"}
        assert set(watermarked.values()) == {RESTARTED}

        # The history replayed from an LSN in the middle of the change table (the CLI's
        # --replay-from): the changes it reads again are ones it holds, so it stays as it was.
        captured = spark.read.format("delta").load(str(warehouse / "shop_changes"))
        lsns = sorted({r.lsn for r in captured.select("lsn").collect()}, key=parse_lsn)
        replayed = f"items_history=lsn:{lsns[len(lsns) // 2]}"
        assert _run(spec, server.dsn, None, "--replay-from", replayed) == 0
        again = spark.read.format("delta").load(str(warehouse / "items_history")).collect()
        assert _versions(again) == history
        log = spark.read.format("delta").load(str(spec.parent / "storage" / "event_log"))
        assert [r.flow for r in log.where("event_type = 'replay'").collect()] == ["items_history"]
    finally:
        server.stop()
