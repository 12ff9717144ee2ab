"""The engine's own SQL settings: interpreted expressions for small tables, compiled ones
for large tables, and the session's own setting back after a batch."""

from __future__ import annotations

from pyspark.sql import functions as F

from autocdc.engine import commit, tuning

FACTORY_MODE = "spark.sql.codegen.factoryMode"


def test_large_tables_run_compiled_and_the_session_keeps_its_own_setting(spark):
    spark.conf.set(FACTORY_MODE, "CODEGEN_ONLY")
    try:
        with tuning.engine_settings(spark):
            assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
            tuning.fit_to_size(spark, tuning.COMPILED_FROM_BYTES - 1)
            assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
            tuning.fit_to_size(spark, tuning.COMPILED_FROM_BYTES)
            assert spark.conf.get(FACTORY_MODE) == "FALLBACK"
        assert spark.conf.get(FACTORY_MODE) == "CODEGEN_ONLY"
    finally:
        spark.conf.unset(FACTORY_MODE)


def test_a_tables_size_is_that_of_its_current_files(spark, new_table):
    name = new_table("sized")
    spark.range(1_000).select(
        F.col("id"), F.sha1(F.col("id").cast("string")).alias("v")
    ).write.format("delta").saveAsTable(name)
    spark.range(10).write.format("delta").mode("overwrite").option(
        "overwriteSchema", "true"
    ).saveAsTable(name)
    detail = spark.sql(f"DESCRIBE DETAIL {name}").first()["sizeInBytes"]
    assert commit.table_bytes(spark, name) == detail > 0
