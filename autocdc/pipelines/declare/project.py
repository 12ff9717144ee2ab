"""The pipeline spec, ``spark-pipeline.yml``: the file Spark 4.2's ``spark-pipelines`` CLI reads.

Fields, glob rules and discovery follow Spark's ``cli.py`` so one project runs under either
tool; autocdc's own settings therefore live in ``configuration`` (``autocdc.*`` keys, and
``spark.sql.warehouse.dir`` for the warehouse). Where Spark would silently ignore or skip
something (both ``database`` and ``schema``, extra keys in a library entry, a library
matching no file) autocdc refuses it. Every problem is one :class:`PipelineSpecError` that
names the file, the field and its line.
"""

from __future__ import annotations

import hashlib
import re
from glob import has_magic
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from autocdc.pipelines.errors import PipelineError
from autocdc.runtime import LOG_FILE

SPEC_FILE_NAMES = ("spark-pipeline.yml", "spark-pipeline.yaml")
WAREHOUSE_KEY = "spark.sql.warehouse.dir"
FIELDS = "name, storage, catalog, database (or schema), configuration, libraries"
LIBRARY_SHAPE = "Write each library as `- glob: {include: transformations/**}`."
Loc = tuple[Any, ...]


class PipelineSpecError(PipelineError):
    error_class = "AUTOCDC_PIPELINE_SPEC_INVALID"
    template = "{file}{where}: {problem}. {hint}"


class LibraryGlob(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    include: str

    @field_validator("include")
    @classmethod
    def _spark_pattern(cls, pattern: str) -> str:
        """Spark's CLI accepts only a path or `folder/**` (validate_patch_glob_pattern) and
        Path.glob refuses absolute patterns: refuse the same here, before anything runs."""
        plain = not has_magic(pattern) or (pattern.endswith("/**") and not has_magic(pattern[:-3]))
        if not pattern or Path(pattern).is_absolute() or not plain:
            raise PydanticCustomError(
                "autocdc",
                "{problem}",
                {
                    "problem": f"library pattern {pattern!r} is not supported",
                    "hint": "Use a file path or `folder/**` (every file below folder), "
                    "relative to the spec's folder; Spark's CLI refuses other patterns.",
                },
            )
        return pattern


class Library(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    glob: LibraryGlob


class Project(BaseModel):
    """A validated spec and the file it came from; paths in it are relative to that file."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    name: str
    storage: str
    catalog: str | None = None
    database: str | None = Field(default=None, validation_alias=AliasChoices("database", "schema"))
    configuration: dict[str, str] = {}
    libraries: list[Library] = []
    spec_path: Path
    _node: yaml.Node | None = PrivateAttr(default=None)  # the YAML, to point at lines

    @property
    def root(self) -> Path:
        return self.spec_path.parent

    @property
    def storage_path(self) -> Path:
        return self._local(self.storage, ("storage",))

    @property
    def session_conf(self) -> dict[str, str]:
        """The session's settings: the spec's ``configuration``, and the log file in the
        project folder (unless it names one), wherever the warehouse is."""
        return {LOG_FILE: str(self.root / "autocdc-logs" / "autocdc.log"), **self.configuration}

    @property
    def warehouse(self) -> Path:
        if WAREHOUSE_KEY in self.configuration:
            return self._local(self.configuration[WAREHOUSE_KEY], ("configuration", WAREHOUSE_KEY))
        return self.root / "warehouse"

    def library_files(self) -> list[Path]:
        """The definition files, in library order, each library's files sorted (the
        filesystem's order differs between machines); a file listed twice loads once."""
        files: dict[Path, None] = {}
        for i, library in enumerate(self.libraries):
            pattern, loc = library.glob.include, ("libraries", i, "glob", "include")
            if pattern.endswith("/**"):  # Spark globs `folder/**/*`: every file below
                found = sorted(p for p in self.root.glob(pattern + "/*") if p.is_file())
                found = [p for p in found if "__pycache__" not in p.relative_to(self.root).parts]
            else:
                found = [self.root / pattern] if (self.root / pattern).is_file() else []
            if not found:
                hint = f"Paths are relative to {self.root}; a folder is written `folder/**`."
                raise self._error(loc, f"library pattern {pattern!r} matches no file", hint)
            for path in found:
                if path.suffix not in (".py", ".sql"):
                    problem = f"{path} is neither a Python (.py) nor a SQL (.sql) file"
                    hint = "Move it out of the library folder, or list the definition files."
                    raise self._error(loc, problem, hint)
                files[path] = None
        return list(files)

    def checkpoint(self, flow: str) -> Path:
        """A folder per flow. Unsafe characters become `_` plus a hash of the name, so two
        flows never share one; no `%` escapes, which Hadoop paths would decode."""
        safe = re.sub(r"[^A-Za-z0-9_.-]|^\.", "_", flow)
        if safe != flow or not flow:
            safe += "-" + hashlib.sha256(flow.encode()).hexdigest()[:8]
        return self.storage_path / "checkpoints" / safe

    def _local(self, value: str, loc: Loc) -> Path:
        """A local path, or a `file:` URI as Spark's own `init` writes; relative to root."""
        if not value:
            raise self._error(loc, "the path is empty", "Give a folder, e.g. `storage: storage`.")
        if value.startswith("file:"):
            value = unquote(value[5:])
            if value.startswith("//"):
                host, _, rest = value[2:].partition("/")
                if host not in ("", "localhost"):
                    raise self._error(loc, f"{host!r} is not this machine", "Use file:///path.")
                value = "/" + rest
        elif re.match(r"[A-Za-z][A-Za-z0-9+.-]+://", value):
            hint = "Use a local path (relative to the spec's folder) or a file:// URI."
            raise self._error(loc, f"{value!r} is not a local folder", hint)
        return (self.root / value).resolve()

    def _error(self, loc: Loc, problem: str, hint: str) -> PipelineSpecError:
        return _error(self.spec_path, self._node, loc, problem, hint)


def find_spec(start: Path) -> Path:
    """The spec in ``start`` or its nearest parent, found as Spark's CLI finds it."""
    start = start.absolute()
    try:
        for folder in (start, *start.parents):
            found = [folder / name for name in SPEC_FILE_NAMES if (folder / name).is_file()]
            if len(found) > 1:
                hint = "Keep one of them (Spark's CLI refuses both too)."
                raise _error(folder, None, (), f"both {' and '.join(SPEC_FILE_NAMES)} exist", hint)
            if found:
                return found[0]
    except PermissionError:
        pass  # as Spark: an unreadable folder ends the search
    problem = f"no {' or '.join(SPEC_FILE_NAMES)} here or in any parent folder"
    raise _error(start, None, (), problem, "Pass `--spec PATH`, or run `autocdc init`.")


def load(path: Path) -> Project:
    """Read and check a spec completely (libraries included), so errors come before a run."""
    spec_path = Path(path).resolve()
    try:
        text = spec_path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as err:
        raise _error(spec_path, None, (), f"cannot read it ({err})", "Check the path.") from None
    loader = yaml.SafeLoader(text)
    try:  # compose, then construct: the nodes give each field's line
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        says = [getattr(err, "context", None), getattr(err, "problem", None)]
        error = PipelineSpecError(
            file=str(spec_path),
            field="",
            line=mark.line + 1 if mark else None,
            problem=f"invalid YAML ({', '.join(filter(None, says)) or err})",
            hint="Fix the syntax at that line.",
            where=f":{mark.line + 1}" if mark else "",
        )
        raise error from None
    finally:
        loader.dispose()
    if isinstance(data, dict) and "spec_path" in data:  # set by load, never by the file
        raise _error(spec_path, node, ("spec_path",), "unknown field `spec_path`", f"Use {FIELDS}.")
    try:
        project = Project.model_validate(
            {**data, "spec_path": spec_path} if isinstance(data, dict) else data
        )
    except ValidationError as err:
        first = err.errors()[0]
        raise _error(spec_path, node, first["loc"], *_explain(first)) from None
    project._node = node
    _ = project.storage_path, project.warehouse, project.library_files()  # raise here
    return project


def _explain(e: ErrorDetails) -> tuple[str, str]:
    """Problem and hint for a pydantic error, in the words of the spec file."""
    loc = [str(p) for p in e["loc"] if p != "[key]"]
    field, got, kind = ".".join(loc), e["input"], e["type"]
    in_libraries = loc[:1] == ["libraries"]
    fields = f"Use {FIELDS}; autocdc's settings go in `configuration`."
    if kind == "autocdc":
        return e["ctx"]["problem"], e["ctx"]["hint"]
    if kind == "extra_forbidden" and loc == ["schema"]:
        return "both `database` and `schema` are set", "`schema` is another name for it: keep one."
    if kind == "extra_forbidden":
        return f"unknown field `{field}`", LIBRARY_SHAPE if in_libraries else fields
    if kind == "missing":
        return (
            f"required field `{field}` is missing",
            LIBRARY_SHAPE if in_libraries else f"Add a `{field}:` line.",
        )
    if kind == "string_type" and got is None:
        return f"`{field}` is empty", "Give it a value, or remove the line."
    if kind == "string_type":
        what = "key" if e["loc"][-1] == "[key]" else "value"
        return (
            f"`{field}` must be a string, not {got!r}",
            f"Quote the {what} in YAML so it is read as text.",
        )
    if not loc:
        problem = "the file is empty" if got is None else "the file is not a mapping of fields"
        return problem, f"Write `field: value` lines; fields: {FIELDS}."
    needed = "a list" if kind == "list_type" else "a mapping"
    return f"`{field}` must be {needed}, not {got!r}", LIBRARY_SHAPE if in_libraries else fields


def _error(
    file: Path, node: yaml.Node | None, loc: Loc, problem: str, hint: str
) -> PipelineSpecError:
    """The error for field ``loc``, pointing at its line (or its nearest parent's)."""
    field = ".".join(str(p) for p in loc if p != "[key]")
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            pairs = [(k, v) for k, v in node.value if str(k.value) == str(part)]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            pairs = [(v, v) for v in node.value[part : part + 1]]
        else:
            break
        if not pairs:
            break
        key, node = pairs[-1]  # YAML keeps the last of duplicate keys
        line = key.start_mark.line + 1
    where = (f":{line}" if line else "") + (f" ({field})" if field else "")
    return PipelineSpecError(
        file=str(file), field=field, line=line, problem=problem, hint=hint, where=where
    )
