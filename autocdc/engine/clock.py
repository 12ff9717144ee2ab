"""One clock for a target that a snapshot flow shares with change flows.

A snapshot taken at sequence S (the change feed's position it reflects: an LSN, an offset,
a time) holds every change at or below S and none above. In the fold it stands for a
TRUNCATE at S (every change at or below S is covered, whichever order it arrives in) and
then an upsert of each of its rows just above S, below any change after S:

* a change older than the snapshot, or at S itself, loses to it;
* a change newer than S wins over it;
* a key the snapshot lacks is deleted, unless a change after S brings it back.

Nothing in a sequence's own type sits "just above S", so the target's sequence is a
struct of the declared one and a tier: ``(sequence, 0)`` for every change and for the
snapshot's truncate, ``(sequence, 1)`` for the snapshot's rows. The engine then folds the
snapshot as it folds any batch (the truncate horizon and the tombstones keep a late, older
change out), and ties at S are settled by the tier, never by arrival order. Change flows
into such a target declare ``snapshot_target=True`` (a pipeline does it for them); the
stored sequence type records the struct, so a flow declared without it is refused.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ByteType, DataType, StructField, StructType

SEQUENCE_FIELD = "sequence"
TIER_FIELD = "__autocdc_tier"
CHANGE, SNAPSHOT = 0, 1


def tiered(sequence: Column, tier: int | Column) -> Column:
    """``sequence`` on the shared clock, at ``tier`` (CHANGE or SNAPSHOT)."""
    at = tier if isinstance(tier, Column) else F.lit(tier)
    return F.struct(sequence.alias(SEQUENCE_FIELD), at.cast("tinyint").alias(TIER_FIELD))


def shared_type(declared: DataType) -> StructType:
    """The type of a sequence of type ``declared`` on the shared clock."""
    return StructType([StructField(SEQUENCE_FIELD, declared), StructField(TIER_FIELD, ByteType())])
