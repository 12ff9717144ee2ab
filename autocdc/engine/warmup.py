"""The workload the class archive records (:mod:`autocdc.runtime.archive`): what a pipeline
run does, in small. The runtime makes the archive but sits below the engine, so the
engine passes it this workload: ``python -m autocdc.engine.warmup`` (``make setup``,
after the jars) makes the archive, and is silent when a usable one is there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from autocdc.engine.flow import AutoCdcFlow
from autocdc.runtime import dump


def workload(spark: SparkSession, root: Path) -> None:
    """A streaming query applies change files in ``root``, SCD type 1 and 2."""
    changes = root / "changes"
    changes.mkdir()
    rows = [
        '{"id": 1, "a": "x", "op": "U", "seq": 1}',
        '{"id": 2, "a": "y", "op": "U", "seq": 2}',
        '{"id": 1, "a": null, "op": "D", "seq": 3}',
    ]
    (changes / "1.json").write_text("\n".join(rows) + "\n")
    flows = [
        AutoCdcFlow(
            target=f"scd{scd}",
            keys=["id"],
            sequence_by="seq",
            apply_as_deletes="op = 'D'",
            except_column_list=["op", "seq"],
            stored_as_scd_type=scd,
        )
        for scd in (1, 2)
    ]

    def apply(batch: DataFrame, _batch_id: int) -> None:
        for flow in flows:
            flow.apply(batch)
        flows[0].apply(batch)  # a replay: the path of a batch that changes nothing

    stream = spark.readStream.schema("id INT, a STRING, op STRING, seq BIGINT").json(str(changes))
    query = (
        stream.writeStream.foreachBatch(apply)
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    for flow in flows:
        flow.current(spark).collect()


if __name__ == "__main__":
    sys.exit(dump.main(workload))
