"""Customers from daily full exports (data/customers/<yyyymmdd>.json) into `customers`,
SCD type 2: each export is diffed against the table's current versions, at the export's
date. A new customer opens a version; a changed one closes its version and opens another;
one missing from an export is closed (and comes back as a new version). A change of
email alone updates the current version in place: history is not tracked on it.

`next_snapshot(latest_version)` returns the first export after the last date processed
(None before the first), or None when there is none: each run calls it until then.
"""

from pathlib import Path

from autocdc import pipelines as dp

EXPORTS = Path(__file__).resolve().parent.parent / "data" / "customers"
SCHEMA = "id INT, name STRING, city STRING, email STRING"


def next_snapshot(latest_version):
    days = sorted(int(path.stem) for path in EXPORTS.glob("*.json"))
    later = [day for day in days if latest_version is None or day > latest_version]
    if not later:
        return None
    export = EXPORTS / f"{later[0]}.json"
    return spark.read.schema(SCHEMA).json(str(export)), later[0]  # noqa: F821 - given


dp.create_streaming_table("customers")
dp.create_auto_cdc_from_snapshot_flow(
    target="customers",
    source=next_snapshot,
    keys=["id"],
    stored_as_scd_type=2,
    track_history_except_column_list=["email"],
)
