"""The notebooks in notebooks/ run end to end, and are kept in git without outputs.

Each notebook runs in a copy of the folder (its tables and project files stay out of the
tree) against this tree's autocdc; its own asserts check the tables it builds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from processes import ROOT, child_env
from sparkconf import JVM_OPTIONS

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# A small local Spark: the machine's 2 cores are shared with other test runs.
SMALL = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.driver.extraJavaOptions": JVM_OPTIONS,
}


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "no notebooks/*.ipynb: the tests below would check nothing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path: Path) -> None:
    """Outputs and counts would make every run a diff, and go stale as the code changes."""
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    dirty = [
        i
        for i, cell in enumerate(notebook.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, f"{path.name}: cells {dirty} have outputs (clear them before committing)"


@pytest.mark.e2e
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_end_to_end(path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "notebooks"
    shutil.copytree(
        path.parent,
        folder,
        ignore=shutil.ignore_patterns("warehouse", "*_project", ".ipynb_checkpoints"),
    )
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in SMALL.items()))
    # The kernel imports this tree's autocdc (not another worktree's editable install).
    env = child_env()
    env["AUTOCDC_CONF_DIR"] = str(conf)

    notebook = nbformat.read(folder / path.name, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=600,
        resources={"metadata": {"path": str(folder)}},  # the notebook's folder is its cwd
    )
    client.execute(env=env)  # raises CellExecutionError, with the cell, if one fails

    assert all(cell.execution_count for cell in notebook.cells if cell.cell_type == "code")
