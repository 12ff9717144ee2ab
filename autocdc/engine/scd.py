"""What the two SCD strategies (:mod:`~autocdc.engine.scd1`, :mod:`~autocdc.engine.scd2`)
plan alike: each reads the stored rows of the batch's keys alone, and bounds its MERGE by
the keys it acts on, listed when there can be few."""

from __future__ import annotations

from pyspark.sql import DataFrame

from autocdc.engine import bound as kb
from autocdc.engine.batch import Batch


def of_batch_keys(batch: Batch, stored: DataFrame, keys: DataFrame) -> DataFrame:
    """The rows of ``stored`` whose key the batch touches (``keys``: a row per keyed
    change), so that the reconcile reads no other key's state: within the batch's key
    range, filtered in the scan, and semi-joined with ``keys`` unless the range lists them
    (:func:`~autocdc.engine.bound.of_keys`)."""
    counts = batch.counts
    return kb.of_keys(stored, counts.key_range, batch.layout.key_names, keys, counts.keyed)


def listed(batch: Batch) -> bool:
    """Whether the keys a batch touches are few enough to list in the MERGE's key bound
    (see ``kb.MAX_IN_LIST``); with a truncate every stored key is touched."""
    return not batch.counts.truncates and batch.counts.keyed <= kb.MAX_IN_LIST
