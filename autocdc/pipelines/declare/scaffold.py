"""``autocdc init``: a sample project that ``autocdc run`` runs at once.

A file-drop folder of JSON change files feeds two AUTO CDC flows: one in Python
(autocdc's ``dp``, so every autocdc parameter, ``max_staleness=`` say, can be added to it)
and one in SQL (SCD type 2).
"""

from __future__ import annotations

from pathlib import Path

from autocdc.pipelines.errors import PipelineDefinitionError

FILES = {
    "spark-pipeline.yml": """\
name: {name}
storage: storage
libraries:
  - glob:
      include: transformations/**
""",
    "transformations/customers.py": '''\
"""Customers, latest version per id (SCD type 1), from the change files in data/changes."""

from autocdc import pipelines as dp  # pyspark's dp, plus autocdc's keyword-only options

# `_corrupt_record` catches a line that does not parse or a field of the wrong type (Spark
# fills it only when the schema names it): autocdc quarantines such a line with its raw
# text (reason AUTOCDC_MALFORMED_RECORD) and never stores the column in a target.
CHANGES = "id INT, name STRING, city STRING, op STRING, seq BIGINT, _corrupt_record STRING"


@dp.temporary_view
def customer_changes():
    # New files dropped into data/changes are picked up by the next run.
    return spark.readStream.schema(CHANGES).json("data/changes")  # noqa: F821


dp.create_streaming_table("customers")
dp.create_auto_cdc_flow(
    target="customers",
    source="customer_changes",
    keys=["id"],
    sequence_by="seq",
    apply_as_deletes="op = 'D'",
    except_column_list=["op", "seq"],
)
''',
    "transformations/customers_history.sql": """\
-- Every version of every customer (SCD type 2), from the same change feed.
CREATE OR REFRESH STREAMING TABLE customers_history;

CREATE FLOW customers_history_cdc AS AUTO CDC INTO customers_history
FROM STREAM(customer_changes)
KEYS (id)
APPLY AS DELETE WHEN op = 'D'
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2;
""",
    "data/changes/0001.json": """\
{{"id": 1, "name": "Alice", "city": "Lyon", "op": "U", "seq": 5}}
{{"id": 2, "name": "Bob", "city": "Berlin", "op": "I", "seq": 2}}
{{"id": 1, "name": "Alice", "city": "Paris", "op": "I", "seq": 1}}
{{"id": 2, "name": null, "city": null, "op": "D", "seq": 6}}
{{"id": 3, "name": "Carol", "city": "Rome", "op": "I", "seq": 3}}
""",
}


def create(root: Path) -> Path:
    """Write the sample under ``root`` (which must not exist yet); return its path."""
    if root.exists():
        raise PipelineDefinitionError(
            where=str(root), problem="the folder exists already", hint="Pick a new --name."
        )
    for relative, text in FILES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(name=root.name))
    return root.resolve()
