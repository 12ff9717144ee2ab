"""A throwaway MariaDB server for the tests: Debian's binaries, a datadir in a temp folder,
on 127.0.0.1 at a free port, with user ``autocdc`` (password ``autocdc``) owning database
``shop``. Tests talk to it through the ``mariadb`` client, so they need no Python driver.
Started with ``binlog=True`` it writes a row-based binary log and has user ``repl``, who
may read it as a replica (Debezium's connector) does."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ports import free_port

USER = PASSWORD = "autocdc"
READER, READER_PASSWORD = "reader", "pw-9f3k-never-logged"  # SELECT only: how sources read
DATABASE = "shop"
# Small and not crash-proof on purpose: a throwaway server that starts in well under a
# second. UTC and utf8mb4 so results do not depend on the machine (10.11's own default is
# latin1; Debian's config, which --no-defaults skips, sets utf8mb4).
OPTIONS = [
    "--skip-log-bin",
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=8M",
    "--innodb-flush-log-at-trx-commit=2",
    "--innodb-doublewrite=0",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
    "--default-time-zone=+00:00",
]
# Bootstrap runs without grant tables (CREATE USER fails there): the server runs this at
# start, before it accepts connections.
INIT = f"""CREATE DATABASE IF NOT EXISTS {DATABASE};
CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}';
GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{USER}'@'%';
CREATE USER IF NOT EXISTS '{READER}'@'%' IDENTIFIED BY '{READER_PASSWORD}';
GRANT SELECT ON {DATABASE}.* TO '{READER}'@'%';
"""
REPLICATOR, REPLICATOR_PASSWORD = "repl", "repl"
# What a change-data-capture reader needs: the binary log, row-based with whole rows (the
# image before an update and delete too), and a user who may read it and take a snapshot.
BINLOG = [
    "--log-bin=mysql-bin",
    "--binlog-format=ROW",
    "--binlog-row-image=FULL",
    "--server-id=1",
]
REPLICATION = f"""
CREATE USER IF NOT EXISTS '{REPLICATOR}'@'%' IDENTIFIED BY '{REPLICATOR_PASSWORD}';
GRANT SELECT, RELOAD, LOCK TABLES, SHOW DATABASES, REPLICATION SLAVE, REPLICATION CLIENT
  ON *.* TO '{REPLICATOR}'@'%';
"""
_ESCAPES = {"0": "\0", "t": "\t", "n": "\n"}


def _which(*names: str) -> str | None:
    """The first of ``names`` installed; /usr/sbin is not on a non-root PATH."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    return next((found for name in names if (found := shutil.which(name, path=path))), None)


def _binaries() -> tuple[str, str, str]:
    """Server, datadir initialiser and client, or a skip (a failure in CI) if any is missing."""
    found = (
        _which("mariadbd", "mysqld"),
        _which("mariadb-install-db", "mysql_install_db"),
        _which("mariadb", "mysql"),
    )
    if None in found:
        if os.environ.get("CI"):
            pytest.fail("MariaDB is not installed: .ci/run installs Debian's mariadb-server")
        pytest.skip("MariaDB is not installed (apt-get install mariadb-server)")
    return found  # type: ignore[return-value]


def _tail(log: Path, lines: int = 30) -> str:
    text = log.read_text(errors="replace") if log.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _value(text: str) -> str | None:
    """A field of the client's batch output: NULL is None, \\t \\n \\0 \\\\ unescaped."""
    return None if text == "NULL" else re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], m[1]), text)


@dataclass
class MariaDB:
    root: Path
    port: int
    client: str = field(repr=False)
    host: str = "127.0.0.1"
    user: str = USER
    password: str = PASSWORD
    database: str = DATABASE
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:mariadb://{self.host}:{self.port}/{self.database}"

    def sql(self, statement: str) -> list[tuple[str | None, ...]]:
        """The rows ``statement`` returns (of every result set, in turn), as the client
        prints them: strings, None for NULL (so also for the string 'NULL')."""
        done = subprocess.run(
            [
                self.client,
                "--no-defaults",
                "--protocol=TCP",
                "--connect-timeout=2",
                f"-h{self.host}",
                f"-P{self.port}",
                f"-u{self.user}",
                f"-p{self.password}",
                f"-D{self.database}",
                "-N",
                "-B",
                "-e",
                statement,
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"mariadb failed on {statement!r}:\n{done.stderr.strip()}")
        # Not splitlines(): that also splits on \x0b, \x1c, \u2028..., which the client
        # leaves as they are; it escapes only \n.
        lines = done.stdout.split("\n")[:-1]
        return [tuple(_value(v) for v in line.split("\t")) for line in lines]

    def stop(self) -> None:
        """Kill the server (its data is thrown away) and remove the datadir; the error log
        stays in ``root`` for a post-mortem."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if not os.environ.get("AUTOCDC_KEEP_MARIADB"):
            shutil.rmtree(self.root / "data", ignore_errors=True)

    def __enter__(self) -> MariaDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(tmp: Path, timeout: float = 60, binlog: bool = False) -> MariaDB:
    """A fresh server in folder ``tmp`` (its own, e.g. ``tmp_path_factory.mktemp("mariadb")``),
    once ``autocdc`` can log in over TCP; with ``binlog`` writing the binary log, user
    ``repl`` allowed to read it. Use it as a context manager or call ``stop()``."""
    mariadbd, install_db, client = _binaries()
    tmp.mkdir(parents=True, exist_ok=True)
    sock, log, data = tmp / "mariadbd.sock", tmp / "error.log", tmp / "data"
    if len(os.fsencode(sock)) > 100:  # sun_path is 108 bytes
        raise ValueError(f"the socket path is too long for a Unix socket: {sock}")
    as_root = ["--user=root"] if os.geteuid() == 0 else []  # mariadbd refuses root without it
    installed = subprocess.run(
        [
            install_db,
            "--no-defaults",  # must come first; no /etc/mysql config
            f"--datadir={data}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *as_root,
            *OPTIONS,
        ],
        capture_output=True,
        text=True,
    )
    if installed.returncode:
        raise RuntimeError(f"mariadb-install-db failed:\n{installed.stdout}{installed.stderr}")
    (tmp / "init.sql").write_text(INIT + (REPLICATION if binlog else ""))
    options = [*BINLOG, *(o for o in OPTIONS if o != "--skip-log-bin")] if binlog else OPTIONS
    server = MariaDB(root=tmp, port=free_port(), client=client)
    server.process = subprocess.Popen(
        [
            mariadbd,
            "--no-defaults",
            *as_root,
            f"--datadir={data}",
            f"--socket={sock}",
            f"--pid-file={tmp / 'mariadbd.pid'}",
            f"--log-error={log}",
            f"--init-file={tmp / 'init.sql'}",
            "--bind-address=127.0.0.1",
            f"--port={server.port}",
            "--skip-name-resolve",
            *options,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, which stop() kills
    )
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            server.stop()
            raise RuntimeError(f"mariadbd exited; the end of {log}:\n{_tail(log)}")
        try:
            server.sql("SELECT 1")
            return server
        except RuntimeError as error:
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(
                    f"mariadbd did not accept connections within {timeout} s ({error}); "
                    f"the end of {log}:\n{_tail(log)}"
                ) from None
        time.sleep(0.05)
