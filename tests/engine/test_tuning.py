"""The engine's own SQL settings: interpreted expressions for small tables, compiled ones
for large tables, and the session's own setting back after a batch."""

from __future__ import annotations

import threading

import pytest
from users import (
    EXAMPLE,
    EXPECTED,
    SCHEMA,
    assert_target,
    assert_versions,
    history_flow,
    users_flow,
)

from autocdc.engine import bound, commit, sizing, tuning

FACTORY_MODE = "spark.sql.codegen.factoryMode"


def test_large_tables_and_first_batches_run_compiled_and_the_session_keeps_its_setting(spark):
    spark.conf.set(FACTORY_MODE, "CODEGEN_ONLY")
    try:
        with tuning.engine_settings(spark):
            assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
            with tuning.staging(spark, stored_rows=0, source_bytes=None):  # a first batch
                assert spark.conf.get(FACTORY_MODE) == "FALLBACK"
            large = tuning.COMPILED_FROM_BYTES
            with tuning.staging(spark, stored_rows=1, source_bytes=large):
                assert spark.conf.get(FACTORY_MODE) == "FALLBACK"
            for unknown_or_small in (None, large - 1):
                with tuning.staging(spark, stored_rows=1, source_bytes=unknown_or_small):
                    assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
            assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
            tuning.fit_to_size(spark, tuning.COMPILED_FROM_ROWS - 1)
            assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
            tuning.fit_to_size(spark, tuning.COMPILED_FROM_ROWS)
            assert spark.conf.get(FACTORY_MODE) == "FALLBACK"
        assert spark.conf.get(FACTORY_MODE) == "CODEGEN_ONLY"
    finally:
        spark.conf.unset(FACTORY_MODE)


def test_a_sources_size_is_the_files_size_and_unknown_for_rows_from_python(spark, tmp_path):
    rows = spark.createDataFrame(EXAMPLE, SCHEMA)
    assert tuning.estimated_bytes(rows) is None
    rows.write.parquet(str(tmp_path / "batch"))
    size = sum(f.stat().st_size for f in (tmp_path / "batch").glob("*.parquet"))
    assert tuning.estimated_bytes(spark.read.parquet(str(tmp_path / "batch"))) == size


def test_a_batch_rebuilds_its_tables_snapshots_beside_it_and_a_failed_rebuild_is_harmless(
    spark, new_table, monkeypatch
):
    """The warm-up reads the state's snapshot, then the target's, from its own thread and
    in a session of its own, interpreted whatever the batch's session runs; it ends with
    the batch, and when it fails the batch still applies, exactly."""
    snapshot, warmed, failing = commit._snapshot, [], threading.Event()
    sessions = set()

    def watched(spark_, name):
        if threading.current_thread().name == "autocdc-warm":
            warmed.append(name)
            sessions.add((spark_._jsparkSession.hashCode(), spark_.conf.get(FACTORY_MODE)))
            if failing.is_set():
                raise RuntimeError("warm-up failed")
        return snapshot(spark_, name)

    monkeypatch.setattr(commit, "_snapshot", watched)
    target = new_table("warm")
    flow = users_flow(target)
    with monkeypatch.context() as m:  # the batch runs compiled, as into a large table
        m.setitem(tuning.SETTINGS, FACTORY_MODE, "FALLBACK")
        flow.apply(spark.createDataFrame(EXAMPLE[:3], SCHEMA))
    assert warmed == [flow.state_table, target]
    assert sessions == {(commit._warming_session(spark)._jsparkSession.hashCode(), "NO_CODEGEN")}
    assert spark._jsparkSession.hashCode() not in {s for s, _ in sessions}
    assert not [t for t in threading.enumerate() if t.name == "autocdc-warm"]

    failing.set()
    flow.apply(spark.createDataFrame(EXAMPLE[3:], SCHEMA))
    assert warmed[2:] == [flow.state_table]  # the first failure ends the warm-up
    assert_target(spark, target, EXPECTED)


@pytest.mark.parametrize("scd_type", [1, 2])
def test_a_merge_source_is_sized_by_its_values_bytes_not_a_guess_at_them(
    spark, new_table, monkeypatch, scd_type
):
    """A string is guessed at 20 bytes, and a flow's text may hold kilobytes: the MERGE's
    source is summed as it is materialized, and not broadcast when its real bytes are too
    many, even where the guess would fit (a broadcast of them could exhaust the driver)."""
    small, calls = sizing.small, []

    def spy(df, rows, size=None):
        calls.append((size, sizing.fits(df, rows), sizing.fits(df, rows, size)))
        return small(df, rows, size)

    monkeypatch.setattr(sizing, "small", spy)
    monkeypatch.setattr(sizing, "BROADCAST_BYTES", 4096)
    monkeypatch.setattr(bound, "MAX_IN_LIST", 0)  # a range: SCD2 broadcasts only then
    target = new_table(f"sized{scd_type}")
    flow = users_flow(target) if scd_type == 1 else history_flow(target)
    first = [(1, "a", "c", "INSERT", 1), (2, "b", "c", "INSERT", 1)]
    flow.apply(spark.createDataFrame(first, SCHEMA))
    text = "x" * 3000
    calls.clear()
    flow.apply(spark.createDataFrame([(k, text, "c", "UPDATE", 2) for k in (1, 2)], SCHEMA))

    sized = [call for call in calls if call[0] is not None]
    assert len(sized) == 1
    size, guess_fits, fits = sized[0]
    assert guess_fits and not fits  # 2 to 4 rows of a few columns, but 6,000 bytes of text
    if scd_type == 1:  # 8 bytes a value (userId, name, city), and the strings' lengths
        assert size == 2 * (3 * 8 + len(text) + len("c"))
        assert_target(spark, target, [(k, text, "c") for k in (1, 2)])
    else:
        assert size > 2 * len(text)
        closed = [(k, n, "c", 1, 2) for k, n in ((1, "a"), (2, "b"))]
        assert_versions(spark, target, closed + [(k, text, "c", 2, None) for k in (1, 2)])
