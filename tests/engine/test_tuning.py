"""The engine's own SQL settings: interpreted expressions for small tables, compiled ones
for large tables, and the session's own setting back after a batch."""

from __future__ import annotations

import threading

from users import EXAMPLE, EXPECTED, SCHEMA, assert_target, users_flow

from autocdc.engine import commit, tuning

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
