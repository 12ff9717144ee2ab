"""One run at a time: the storage lease of :mod:`autocdc.pipelines.execute.lock`, held by real
processes that are refused, killed, stopped and raced (no Spark, except the CLI test)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from processes import child_env, start_holder
from projects import write_project
from sparkconf import SMALL_SPARK

from autocdc.pipelines.declare import project
from autocdc.pipelines.declare.project import PipelineSpecError
from autocdc.pipelines.errors import PipelineLockedError
from autocdc.pipelines.execute import lock

# argv: storage root, rounds, start (epoch), contenders; in round r, at start + r / 4 s,
# claims <root>/<r> and prints "r won" or "r refused"; keeps what it won until every
# contender is done (so a late one cannot win a lease released meanwhile)
CONTENDER = """
import contextlib, os, sys, time
from autocdc.pipelines.execute import lock
from autocdc.pipelines.errors import PipelineLockedError
root, rounds, start, contenders = (
    sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
)
with contextlib.ExitStack() as held:
    for r in range(rounds):
        time.sleep(max(0.0, start + r / 4 - time.time()))
        try:
            held.enter_context(lock.hold(f"{root}/{r}", "shop", 60.0))
            print(r, "won", flush=True)
        except PipelineLockedError:
            print(r, "refused", flush=True)
    open(f"{root}/done-{os.getpid()}", "w").close()
    while sum(name.startswith("done-") for name in os.listdir(root)) < contenders:
        time.sleep(0.1)
"""


def lease(storage: Path) -> dict:
    return json.loads((storage / lock.LEASE).read_text())


def foreign_claim(storage: Path, heartbeat: float) -> None:
    """The lease of a run on another machine, last heard of at ``heartbeat``."""
    at = datetime.fromtimestamp(heartbeat, timezone.utc).isoformat()
    storage.mkdir(parents=True, exist_ok=True)
    fields = {"pipeline": "shop", "host": "elsewhere", "pid": 4242, "run_id": "r0"}
    (storage / lock.LEASE).write_text(json.dumps({**fields, "since": at, "heartbeat": at}))


@pytest.mark.e2e
def test_a_second_run_is_refused_naming_the_holder_and_sigterm_releases(tmp_path):
    holder = start_holder(tmp_path, expiry=60)
    with pytest.raises(PipelineLockedError) as refused, lock.hold(tmp_path, "shop"):
        pytest.fail("a second holder")
    assert refused.value.error_class == "AUTOCDC_PIPELINE_LOCKED"
    params = refused.value.params
    assert (params["host"], params["pid"]) == (socket.gethostname(), holder.pid)
    assert (params["since"], params["path"]) == (
        lease(tmp_path)["since"],
        str(tmp_path / lock.LEASE),
    )

    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=300) == 128 + signal.SIGTERM
    assert os.listdir(tmp_path) == []  # the lease is removed, and nothing else is left
    with lock.hold(tmp_path, "shop"):
        assert lease(tmp_path)["pid"] == os.getpid()
    assert os.listdir(tmp_path) == []


@pytest.mark.e2e
def test_a_killed_holder_on_this_machine_is_taken_over_at_once(tmp_path):
    holder = start_holder(tmp_path, expiry=3600)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=300)
    assert lease(tmp_path)["pid"] == holder.pid  # kill -9 leaves the lease
    with lock.hold(tmp_path, "shop", expiry=3600):  # not by expiry: the pid is gone
        assert lease(tmp_path)["pid"] == os.getpid()


@pytest.mark.parametrize(
    "change",
    [{"boot_id": "rebooted"}, {"started": "1"}, {"pid": 2**22 + 1}],
    ids=["machine-rebooted", "pid-reused", "pid-gone"],
)
def test_dead_claims_of_this_machine_are_taken_over_at_once(tmp_path, change):
    with lock.hold(tmp_path, "shop"):
        claim = lease(tmp_path)
    (tmp_path / lock.LEASE).write_text(json.dumps({**claim, **change}))
    with lock.hold(tmp_path, "shop", expiry=3600):
        assert lease(tmp_path)["run_id"] != claim["run_id"]


def test_a_live_claim_of_this_process_is_refused(tmp_path):
    with lock.hold(tmp_path, "shop"), pytest.raises(PipelineLockedError):
        lock.Lease.acquire(tmp_path / lock.LEASE, "shop", 3600)


def test_another_machines_claim_is_refused_until_it_expires(tmp_path):
    foreign_claim(tmp_path, time.time())
    with pytest.raises(PipelineLockedError) as refused, lock.hold(tmp_path, "shop", 1.0):
        pytest.fail("took a fresh claim")
    assert (refused.value.params["host"], refused.value.params["pid"]) == ("elsewhere", 4242)
    time.sleep(1.5)
    with lock.hold(tmp_path, "shop", 1.0):
        assert lease(tmp_path)["host"] == socket.gethostname()
    assert os.listdir(tmp_path) == []


@pytest.mark.e2e
def test_the_heartbeat_keeps_a_long_holder_alive_past_the_expiry(tmp_path):
    holder = start_holder(tmp_path, expiry=2)
    first = lease(tmp_path)["heartbeat"]
    time.sleep(4)  # twice the expiry
    with pytest.raises(PipelineLockedError), lock.hold(tmp_path, "shop", 2):
        pytest.fail("took a live claim")
    assert lease(tmp_path)["heartbeat"] > first
    holder.kill()
    holder.wait(timeout=300)


@pytest.mark.e2e
def test_a_holder_that_lost_its_lease_stops(tmp_path):
    """A holder stalled past the expiry (SIGSTOP) is taken over; when it resumes, its
    heartbeat finds the lease another's and stops it (long before the end of its work,
    even though it started with SIGINT ignored), leaving that lease alone."""
    holder = start_holder(tmp_path, expiry=1, seconds=3600, sigint_ignored=True)
    holder.send_signal(signal.SIGSTOP)
    time.sleep(2)
    with lock.hold(tmp_path, "shop", 1.0) as mine:
        holder.send_signal(signal.SIGCONT)
        _, err = holder.communicate(timeout=600)
        assert holder.returncode == 1
        assert b"[AUTOCDC_PIPELINE_LOCK_LOST]" in err and mine.fields["run_id"].encode() in err
        assert lease(tmp_path)["run_id"] == mine.fields["run_id"]
    assert os.listdir(tmp_path) == []


def test_a_contender_acting_on_a_stale_view_leaves_the_new_holder_alone(tmp_path, monkeypatch):
    """The race of two contenders, in order: both saw the same dead claim; the first took
    over; the second removes "the dead claim" only now, then claims."""
    foreign_claim(tmp_path, heartbeat=0)
    path, read = tmp_path / lock.LEASE, lock._read
    seen = [read(path)]  # the second contender's view, from before the takeover
    with lock.hold(tmp_path, "shop") as first:
        monkeypatch.setattr(lock, "_read", lambda p: seen.pop() if seen else read(p))
        with pytest.raises(PipelineLockedError) as refused:
            lock.Lease.acquire(path, "shop", 60.0)
        assert not seen and refused.value.params["run_id"] == first.fields["run_id"]
        assert lock._owner(path) == first.file
    assert os.listdir(tmp_path) == []


@pytest.mark.e2e
def test_one_of_several_contenders_takes_over_a_dead_claim(tmp_path):
    rounds, contenders = 12, 4
    for r in range(rounds):
        foreign_claim(tmp_path / str(r), heartbeat=0)
    start = time.time() + 8  # after every contender imported autocdc
    args = [sys.executable, "-c", CONTENDER, str(tmp_path), str(rounds), str(start)]
    procs = [
        subprocess.Popen(
            [*args, str(contenders)], env=child_env(), stdout=subprocess.PIPE, text=True
        )
        for _ in range(contenders)
    ]
    said = [line for p in procs for line in p.communicate(timeout=900)[0].splitlines()]
    assert [p.returncode for p in procs] == [0] * contenders
    outcomes = {
        r: sorted(line.split()[1] for line in said if line.split()[0] == str(r))
        for r in range(rounds)
    }
    assert outcomes == dict.fromkeys(range(rounds), ["refused"] * (contenders - 1) + ["won"])
    assert [os.listdir(tmp_path / str(r)) for r in range(rounds)] == [[]] * rounds


def test_expiry_comes_from_the_spec(tmp_path):
    spec = write_project(tmp_path, "shop", {"t.sql": "CREATE MATERIALIZED VIEW v AS SELECT 1"})
    assert lock.expiry_seconds(project.load(spec)) == lock.DEFAULT_EXPIRY_SECONDS
    write_project(tmp_path, "shop", {}, {lock.EXPIRY_KEY: "5"})
    assert lock.expiry_seconds(project.load(spec)) == 5.0
    write_project(tmp_path, "shop", {}, {lock.EXPIRY_KEY: "soon"})
    with pytest.raises(PipelineSpecError) as bad:
        lock.expiry_seconds(project.load(spec))
    assert bad.value.params["field"] == f"configuration.{lock.EXPIRY_KEY}"


@pytest.mark.e2e
def test_cli_refuses_a_second_run_while_one_runs(tmp_path, new_table):
    config = {**SMALL_SPARK, "spark.sql.warehouse.dir": str(tmp_path / "warehouse")}
    files = {"v.sql": "CREATE MATERIALIZED VIEW v AS SELECT 1 AS x;"}
    spec = write_project(tmp_path, new_table("locked"), files, config)
    command = [sys.executable, "-m", "autocdc", "run", "--spec", str(spec)]
    first = subprocess.Popen(
        [*command, "--continuous", "--trigger-interval", "1h"],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert first.stdout is not None
        for line in first.stdout:  # the lease is taken just before the run starts
            if "running continuously" in line:
                break
        second = subprocess.run(
            command, env=child_env(), capture_output=True, text=True, timeout=900
        )
        assert second.returncode == 2, second.stderr
        assert "[AUTOCDC_PIPELINE_LOCKED]" in second.stderr
        assert f"pid {first.pid}," in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        output, _ = first.communicate(timeout=600)
    assert first.returncode == 0, output
    assert not (tmp_path / "storage" / lock.LEASE).exists()
