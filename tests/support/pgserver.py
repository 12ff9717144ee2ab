"""A throwaway PostgreSQL server for the capture tests: Debian's binaries, a cluster in a
temp folder, logical WAL, on 127.0.0.1 at a free port. Started as the `postgres` user when
the tests run as root (PostgreSQL refuses to run as root)."""

from __future__ import annotations

import copy
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest
from ports import free_port


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).resolve().parent if pg_ctl else None


class Server:
    def __init__(self, wal_senders: int = 8) -> None:
        self.wal_senders = wal_senders  # 0: replication connections are refused
        bin_dir = _bin_dir()
        if bin_dir is None:
            if os.environ.get("CI"):
                pytest.fail("PostgreSQL is not installed: .ci/run installs Debian's postgresql")
            pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
        self.bin = bin_dir
        # Not under pytest's tmp_path: that is private to root, and the server may run as
        # the `postgres` user.
        self.root = Path(tempfile.mkdtemp(prefix="autocdc-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")

    def start(self) -> Server:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c wal_level=logical "
            f"-c max_replication_slots=32 -c max_wal_senders={self.wal_senders} -c fsync=off "
            "-c full_page_writes=off"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-w",
            "-o",
            options,
            "start",
        )
        return self

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        if not os.environ.get("AUTOCDC_KEEP_PG"):
            shutil.rmtree(self.root, ignore_errors=True)

    def database(self, name: str) -> Server:
        """This server, connecting to database ``name`` (which must exist)."""
        other = copy.copy(self)
        other.dsn = self.dsn.replace("dbname=postgres", f"dbname={name}")
        return other

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True)

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self.connect() as conn:
            return conn.execute(sql, params or None).fetchall()

    def execute(self, sql: str, params: tuple = ()) -> None:
        with self.connect() as conn:
            conn.execute(sql, params or None)
