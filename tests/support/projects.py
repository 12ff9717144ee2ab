"""Pipeline projects written by tests: a spec, definitions over a drop folder of change
files, and a run in the test's own session."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

from reference import Change

from autocdc.pipelines.declare import project, scaffold
from autocdc.pipelines.execute import pipeline, runner

FEED = "id INT, a STRING, b INT, op STRING, seq BIGINT"

PYSPARK_SCD1 = """
from pyspark import pipelines as dp

@dp.temporary_view
def changes():
    return spark.readStream.schema("{feed}").json("{data}")

dp.create_streaming_table("latest")
dp.create_auto_cdc_flow(
    target="latest", source="changes", keys=["id"], sequence_by="seq",
    apply_as_deletes="op = 'D'", except_column_list=["op", "seq"],
)
"""
SQL_SCD2 = """
-- type 2 from the same feed, and a view over the type 1 table
CREATE OR REFRESH STREAMING TABLE history;
CREATE FLOW history_cdc AS AUTO CDC INTO history
FROM STREAM(changes)
KEYS (id)
APPLY AS DELETE WHEN op = 'D'
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2;
CREATE MATERIALIZED VIEW live_keys AS SELECT count(*) AS n FROM latest;
"""
# An append flow of the same feed: a streaming table of the raw change rows.
RAW = """
from pyspark import pipelines as dp

@dp.table
def raw():
    return spark.readStream.schema("{feed}").json("{data}")
"""


def write_spec(
    root: Path,
    name: str,
    database: str | None = None,
    configuration: dict[str, str] | None = None,
) -> Path:
    """``autocdc init``'s spec (its storage, its libraries: transformations/**) at
    ``root``, named ``name``, with the tables in ``database`` and ``configuration`` when
    given; returns its path."""
    spec = root / "spark-pipeline.yml"
    root.mkdir(parents=True, exist_ok=True)
    settings = "".join(f"  {k}: '{v}'\n" for k, v in (configuration or {}).items())
    spec.write_text(
        scaffold.FILES["spark-pipeline.yml"].format(name=name)
        + (f"database: {database}\n" if database else "")
        + (f"configuration:\n{settings}" if settings else "")
    )
    return spec


def write_project(
    root: Path, database: str, files: dict[str, str], configuration: dict[str, str] | None = None
) -> Path:
    """A project folder with ``files`` under transformations/; returns the spec path."""
    spec = write_spec(root, database, database, configuration)
    for name, text in files.items():
        path = root / "transformations" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).format(feed=FEED, data=root / "data", db=database))
    return spec


def drop(
    root: Path,
    name: str,
    changes: list[Change],
    folder: str = "data",
    op: str = "op",
    seq: str = "seq",
) -> None:
    """A change file in a drop folder of the project (its operation and sequence columns
    named ``op`` and ``seq``), picked up by the next run."""
    (root / folder).mkdir(exist_ok=True)
    lines = [
        json.dumps(
            {
                "id": c.key,
                "a": (c.values or (None, None))[0],
                "b": (c.values or (None, None))[1],
                op: c.op,
                seq: c.seq,
            }
        )
        for c in changes
    ]
    (root / folder / f"{name}.json").write_text("\n".join(lines) + "\n")


def copy_example(example: Path, root: Path, database: str) -> Path:
    """A copy of an example project at ``root``, its tables in ``database``; its spec."""
    shutil.copytree(example, root, ignore=shutil.ignore_patterns("storage", "warehouse"))
    spec = root / "spark-pipeline.yml"
    spec.write_text(re.sub(r"(?m)^database: .*$", f"database: {database}", spec.read_text()))
    return spec


def run(spark, spec: Path, **options) -> list[str]:
    """``autocdc run`` in this session; returns the datasets in run order."""
    return pipeline.execute(spark, project.load(spec), runner.Options(**options)).datasets


def scd1_rows(spark, table: str) -> dict:
    return {r.id: (r.a, r.b) for r in spark.table(table).collect()}


def scd2_rows(spark, table: str) -> set:
    rows = spark.table(table).collect()
    return {(r.id, (r.a, r.b), r["__START_AT"], r["__END_AT"]) for r in rows}
