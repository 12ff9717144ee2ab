"""Subprocess for the kill tests: apply one batch to a flow, maybe dying on the way.

Usage: python crash_worker.py WAREHOUSE TARGET ROWS_JSON SCD_TYPE  (env AUTOCDC_TEST_CRASH_AT)
"""

from __future__ import annotations

import json
import sys

from conftest import TEST_CONF

import autocdc

SCHEMA = "id int, a string, b int, op string, seq long"


def main(warehouse: str, target: str, rows_json: str, scd_type: str) -> None:
    spark = autocdc.spark_session(warehouse=warehouse, conf=TEST_CONF)
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        except_column_list=["op", "seq"],
        stored_as_scd_type=int(scd_type),
    )
    rows = [tuple(r) for r in json.loads(rows_json)]
    flow.apply(spark.createDataFrame(rows, SCHEMA))


if __name__ == "__main__":
    main(*sys.argv[1:5])
