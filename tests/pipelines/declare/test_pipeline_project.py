"""The pipeline spec (spark-pipeline.yml): pure Python, errors asserted by class and params."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from pyspark.errors import PySparkException
from pyspark.pipelines.cli import unpack_pipeline_spec

from autocdc.pipelines.declare.project import PipelineSpecError, find_spec, load

MINIMAL = "name: p\nstorage: storage\n"


def write(folder: Path, text: str, name: str = "spark-pipeline.yml") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def touch(folder: Path, *names: str) -> None:
    for name in names:
        write(folder, "", name)


def refused(path: Path) -> dict:
    with pytest.raises(PipelineSpecError) as err:
        load(path)
    return err.value.params


def test_minimal(tmp_path):
    project = load(write(tmp_path, MINIMAL))
    root = tmp_path.resolve()
    assert (project.name, project.catalog, project.database) == ("p", None, None)
    assert project.spec_path == root / "spark-pipeline.yml"
    assert project.storage_path == root / "storage"
    assert project.warehouse == root / "warehouse"
    assert project.configuration == {}
    assert project.library_files() == []


def test_full(tmp_path):
    touch(tmp_path, "defs/a.py")
    spec = f"""\
        name: p
        storage: file://{tmp_path}/store
        catalog: c
        database: d
        configuration:
          spark.sql.warehouse.dir: wh
          autocdc.anything: "1"
        libraries:
          - glob:
              include: defs/**
        """
    project = load(write(tmp_path, spec, "spark-pipeline.yaml"))
    root = tmp_path.resolve()
    assert (project.catalog, project.database) == ("c", "d")
    assert project.storage_path == root / "store"
    assert project.warehouse == root / "wh"
    assert project.configuration["autocdc.anything"] == "1"
    assert project.libraries[0].glob.include == "defs/**"
    assert project.checkpoint("orders") == root / "store" / "checkpoints" / "orders"
    unpack_pipeline_spec(yaml.safe_load(project.spec_path.read_text()))  # Spark accepts it too


def test_schema_is_database(tmp_path):
    assert load(write(tmp_path, MINIMAL + "schema: s\n")).database == "s"
    params = refused(write(tmp_path, MINIMAL + "database: d\nschema: s\n"))
    assert (params["field"], params["line"]) == ("schema", 4)


def test_checkpoint_names_are_safe_and_distinct(tmp_path):
    project = load(write(tmp_path, MINIMAL))
    names = ["a/b", "a_b", "..", "cat.db.t", "a b"]
    folders = [project.checkpoint(n) for n in names]
    assert len(set(folders)) == len(names)
    assert all(f.parent == project.storage_path / "checkpoints" for f in folders)
    assert folders[3].name == "cat.db.t"
    assert not folders[2].name.startswith(".")


def test_find_spec_from_subfolder(tmp_path):
    spec = write(tmp_path, MINIMAL)
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert find_spec(tmp_path / "a" / "b") == spec
    write(tmp_path, MINIMAL, "spark-pipeline.yaml")
    with pytest.raises(PipelineSpecError) as err:
        find_spec(tmp_path / "a")
    assert err.value.params["file"] == str(tmp_path)


def test_unknown_field(tmp_path):
    params = refused(write(tmp_path, MINIMAL + "catalog: c\nschedule: daily\n"))
    assert (params["field"], params["line"]) == ("schedule", 4)
    assert params["file"] == str(tmp_path.resolve() / "spark-pipeline.yml")
    params = refused(write(tmp_path, MINIMAL + "spec_path: x\n"))
    assert params["field"] == "spec_path"


def test_unknown_library_field(tmp_path):
    params = refused(write(tmp_path, MINIMAL + "libraries:\n  - glob: {include: a.py, x: 1}\n"))
    assert (params["field"], params["line"]) == ("libraries.0.glob.x", 4)


def test_missing_field(tmp_path):
    params = refused(write(tmp_path, "# comment\nname: p\n"))
    assert (params["field"], params["line"]) == ("storage", 2)  # the mapping's first line


def test_configuration_value_not_a_string(tmp_path):
    params = refused(write(tmp_path, MINIMAL + "configuration:\n  a: x\n  spark.x: 1\n"))
    assert (params["field"], params["line"]) == ("configuration.spark.x", 5)


@pytest.mark.parametrize("pattern", ["*.py", "defs/**/*.py", "/abs/**", "defs/*"])
def test_glob_refused_like_spark(tmp_path, pattern):
    spec = MINIMAL + f"libraries:\n  - glob:\n      include: '{pattern}'\n"
    params = refused(write(tmp_path, spec))
    assert (params["field"], params["line"]) == ("libraries.0.glob.include", 5)
    if not pattern.startswith("/"):  # Spark's CLI crashes on absolute ones at run time
        with pytest.raises(PySparkException):
            unpack_pipeline_spec(yaml.safe_load(spec))


@pytest.mark.parametrize("pattern", ["missing/**", "defs", "defs/b.py"])
def test_glob_matching_nothing(tmp_path, pattern):
    touch(tmp_path, "defs/a.py")
    params = refused(write(tmp_path, MINIMAL + f"libraries:\n  - glob: {{include: {pattern}}}\n"))
    assert (params["field"], params["line"]) == ("libraries.0.glob.include", 4)


def test_unsupported_extension(tmp_path):
    touch(tmp_path, "defs/a.py", "defs/notes.md")
    params = refused(write(tmp_path, MINIMAL + "libraries:\n  - glob: {include: defs/**}\n"))
    assert params["field"] == "libraries.0.glob.include"
    assert "notes.md" in params["problem"]


def test_yaml_syntax_error(tmp_path):
    params = refused(write(tmp_path, MINIMAL + "configuration: {a: 1\n"))
    assert (params["field"], params["line"]) == ("", 4)


def test_empty_file(tmp_path):
    assert refused(write(tmp_path, ""))["field"] == ""


def test_library_files_order(tmp_path):
    touch(tmp_path, "defs/b.sql", "defs/a.py", "defs/sub/c.py", "defs/__pycache__/a.py", "z.py")
    spec = MINIMAL + "libraries:\n  - glob: {include: z.py}\n  - glob: {include: defs/**}\n"
    spec += "  - glob: {include: defs/a.py}\n"
    files = load(write(tmp_path, spec)).library_files()
    root = tmp_path.resolve()
    assert files == [root / p for p in ["z.py", "defs/a.py", "defs/b.sql", "defs/sub/c.py"]]


def test_message(tmp_path):
    with pytest.raises(PipelineSpecError) as err:
        load(write(tmp_path, MINIMAL + "libraries:\n  - glob: {include: '*.py'}\n"))
    assert "spark-pipeline.yml:4 (libraries.0.glob.include): library pattern" in str(err.value)
    assert str(err.value).startswith("[AUTOCDC_PIPELINE_SPEC_INVALID] ")
