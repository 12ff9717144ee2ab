"""Materialize a plan's result and aggregate over it in the same Spark job.

A strategy materializes what it reads more than once (``localCheckpoint``), and then
needs a few counts over it (the batch's metrics, the MERGE's key bound). Run as an
aggregate of their own, the counts were one more job per batch, plus the driver's time
to plan it; observed on the way (``DataFrame.observe``), they come with the checkpoint.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Observation, Row


def materialized(df: DataFrame, aggregates: list[Column]) -> tuple[DataFrame, Row]:
    """``df`` materialized, and one row of ``aggregates`` (named columns) over its rows."""
    observation = Observation()
    kept = df.observe(observation, *aggregates).localCheckpoint()
    return kept, Row(**observation.get)
