"""The engine's own SQL settings: interpreted expressions for small tables, compiled ones
for large tables, and the session's own setting back after a batch."""

from __future__ import annotations

from autocdc.engine import tuning

FACTORY_MODE = "spark.sql.codegen.factoryMode"


def test_large_tables_and_first_batches_run_compiled_and_the_session_keeps_its_setting(spark):
    spark.conf.set(FACTORY_MODE, "CODEGEN_ONLY")
    try:
        with tuning.engine_settings(spark):
            assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
            with tuning.staging(spark, stored_rows=0):  # a first batch's counts
                assert spark.conf.get(FACTORY_MODE) == "FALLBACK"
            with tuning.staging(spark, stored_rows=1):
                assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
            assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
            tuning.fit_to_size(spark, tuning.COMPILED_FROM_ROWS - 1)
            assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
            tuning.fit_to_size(spark, tuning.COMPILED_FROM_ROWS)
            assert spark.conf.get(FACTORY_MODE) == "FALLBACK"
        assert spark.conf.get(FACTORY_MODE) == "CODEGEN_ONLY"
    finally:
        spark.conf.unset(FACTORY_MODE)
