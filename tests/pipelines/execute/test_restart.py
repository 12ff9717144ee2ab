"""A run after one that was killed as a flow's query began, and a flow's retries after a
failure that is not autocdc's own (injected here): the targets equal the reference fold,
the event log says what happened."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest
from changes import EVERYTHING
from projects import (
    PYSPARK_SCD1,
    RAW,
    SQL_SCD2,
    drop,
    run,
    scd1_rows,
    scd2_rows,
    write_project,
)
from reference import fold_scd1, fold_scd2

from autocdc.engine.faults import FAIL_ENV
from autocdc.pipelines.declare import project
from autocdc.pipelines.errors import CheckpointNotEmptyError, FlowRetriesExhaustedError
from autocdc.pipelines.execute import retries, runner, unstarted
from autocdc.pipelines.execute.kinds import APPLIED


@pytest.fixture
def shop(tmp_path, new_table):
    """A project of three flows over one folder of change files (SCD1, SCD2, an append),
    every change dropped: (its spec, its database)."""
    database = new_table("restart")
    files = {"feed.py": PYSPARK_SCD1, "history.sql": SQL_SCD2, "raw.py": RAW}
    spec = write_project(tmp_path, database, files)
    drop(tmp_path, "1", EVERYTHING[:7])
    drop(tmp_path, "2", EVERYTHING[7:])
    return spec, database


def events(spark, spec, kind: str) -> list:
    log = project.load(spec).storage_path / "event_log"
    found = spark.read.format("delta").load(str(log)).where(f"event_type = '{kind}'")
    return found.orderBy("event_time").collect()


def assert_converged(spark, database: str) -> None:
    assert scd1_rows(spark, f"{database}.latest") == fold_scd1(EVERYTHING)
    assert scd2_rows(spark, f"{database}.history") == fold_scd2(EVERYTHING)
    assert spark.table(f"{database}.raw").count() == len(EVERYTHING)


@contextmanager
def settings(spark, **values: str):
    """Session settings for the block (the shared session keeps none of them)."""
    keys = {"attempts": retries.ATTEMPTS_KEY, "pause": retries.FIRST_PAUSE_KEY}
    for name, value in values.items():
        spark.conf.set(keys[name], value)
    try:
        yield
    finally:
        for name in values:
            spark.conf.unset(keys[name])


def test_a_query_killed_as_it_logged_its_first_micro_batch_starts_afresh(spark, shop):
    """What a SIGKILL while Spark writes a query's first offsets entry leaves (its private
    file and checksum, a stale note of ours), in every streaming flow's checkpoint: Spark
    alone refuses to start any of them (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY) on
    every later run. The run clears it, says so, and converges."""
    spec, database = shop
    left = f".0.{uuid.uuid4()}.tmp"
    for flow in ("latest", "history_cdc", "raw"):
        folder = project.load(spec).checkpoint(flow)
        (folder / "offsets").mkdir(parents=True)
        (folder / "offsets" / left).write_text("v1\n")
        (folder / "offsets" / f".{left}.crc").write_bytes(b"crc")
        (folder / "commits").mkdir()
    (project.load(spec).checkpoint("latest") / APPLIED).write_text("3")  # never earned
    run(spark, spec)
    assert_converged(spark, database)
    restarted = events(spark, spec, "checkpoint_restarted")
    assert sorted(e.flow for e in restarted) == ["history_cdc", "latest", "raw"]
    assert f"offsets/{left}" in restarted[0].message
    run(spark, spec)  # and it goes on from there: nothing cleared again
    assert len(events(spark, spec, "checkpoint_restarted")) == 3


def test_a_checkpoint_that_logged_a_batch_is_never_cleared(tmp_path):
    folder = tmp_path / "flow"
    (folder / "offsets").mkdir(parents=True)
    (folder / "offsets" / "0").write_text("v1\n{}\n-\n")
    (folder / "offsets" / ".1.abc.tmp").write_text("v1\n")
    (folder / APPLIED).write_text("0")
    assert unstarted.clear(folder, notes=(APPLIED,)) == []
    assert sorted(p.name for p in (folder / "offsets").iterdir()) == [".1.abc.tmp", "0"]
    assert (folder / APPLIED).is_file()


def test_spark_refusing_a_checkpoint_is_an_error_naming_the_flow(tmp_path):
    folder = tmp_path / "flow"
    (folder / "state" / "0").mkdir(parents=True)
    (folder / "state" / "0" / "x").write_text("?")
    spark_said = Exception("[STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY] The checkpoint ...")
    error = runner.checkpoint_refused(spark_said, "orders_cdc", "orders", folder)
    assert isinstance(error, CheckpointNotEmptyError)
    assert error.params["flow"] == "orders_cdc"
    assert error.params["found"] == "state/0/x"
    assert "--full-refresh orders" in str(error)
    assert runner.checkpoint_refused(Exception("other"), "f", "d", folder) is None


def test_a_flow_failing_twice_is_retried_and_converges(spark, shop, monkeypatch):
    """The SCD1 flow's first two micro-batch attempts fail (not autocdc's error): a
    triggered run starts it again from its checkpoint after each, logs each retry with
    its cause, and every target equals the reference; the flows after it ran as usual."""
    spec, database = shop
    monkeypatch.setenv(FAIL_ENV, "apply:latest@2")
    with settings(spark, attempts="2", pause="1s"):
        run(spark, spec)
    assert_converged(spark, database)
    retried = events(spark, spec, "flow_retry")
    assert [(e.flow, e.error_class) for e in retried] == [("latest", "InjectedFault")] * 2
    assert retried[0].message.startswith("attempt 1 of 2 in 1 s: injected fault at apply:latest")
    assert events(spark, spec, "error") == []


def test_a_flow_out_of_attempts_fails_the_run_naming_it(spark, shop, monkeypatch):
    """Three failures with two attempts allowed: the run fails with an autocdc error that
    names the flow and its last cause; the next run goes on from the checkpoint."""
    spec, database = shop
    monkeypatch.setenv(FAIL_ENV, "apply:history_cdc@3")
    with settings(spark, attempts="2", pause="1s"), pytest.raises(FlowRetriesExhaustedError) as err:
        run(spark, spec)
    assert err.value.params["flow"] == "history_cdc"
    assert err.value.params["failures"] == 3
    assert "InjectedFault" in err.value.params["cause"]
    assert [e.flow for e in events(spark, spec, "error")] == ["history_cdc"]
    run(spark, spec)
    assert_converged(spark, database)


def test_retry_settings_read_as_spark_writes_them():
    policy = retries.Retries.of(
        {
            retries.ATTEMPTS_KEY: "3",
            retries.FIRST_PAUSE_KEY: "500ms",
            retries.LONGEST_PAUSE_KEY: "1s",
        }
    )
    failure = RuntimeError("Python worker failed to connect back")
    assert [policy.next("f", failure) for _ in range(4)] == [(1, 0.5), (2, 1.0), (3, 1.0), None]
    policy.succeeded("f")
    assert policy.next("f", failure) == (1, 0.5)
    assert retries.Retries.of({}).next("g", failure) == (1, 5.0)
    assert policy.next("f", KeyboardInterrupt()) is None
    assert (
        policy.next("f", CheckpointNotEmptyError(flow="f", dataset="d", checkpoint="c", found="x"))
        is None
    )
