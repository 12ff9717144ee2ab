"""The package's layers import downward only: runtime <- engine <- sources <- pipelines (the
CLI is in pipelines, the public API in the package root), and inside pipelines the steps of a
run: declare <- execute <- operations (each on the pipelines' errors). Above the engine, the
runtime and the engine are reached through their packages' exports, never their modules. A
module that imports upward, or past a package's exports, is named with what it imported, so
the fix is where the message points."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import autocdc

PACKAGE = Path(autocdc.__file__).parent
# The lowest layers, which the layers above them reach through their packages' `__all__`.
FACES = ("autocdc.runtime", "autocdc.engine")
# What each layer may import from autocdc: itself and the layers below it, never the root.
# The most specific prefix first: a module belongs to the first layer it starts with.
BELOW_PIPELINES = (*FACES, "autocdc.sources", "autocdc.pipelines.errors")
DECLARE = (*BELOW_PIPELINES, "autocdc.pipelines.declare")
RUN = (*DECLARE, "autocdc.pipelines.execute")
ALLOWED = {
    "autocdc.runtime": ("autocdc.runtime",),
    "autocdc.engine": FACES,
    "autocdc.sources": (*FACES, "autocdc.sources"),
    "autocdc.pipelines.errors": BELOW_PIPELINES,
    "autocdc.pipelines.declare": DECLARE,
    "autocdc.pipelines.execute": RUN,
    "autocdc.pipelines.operations": (*RUN, "autocdc.pipelines.operations"),
    "autocdc.pipelines": (*FACES, "autocdc.sources", "autocdc.pipelines"),
}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST) -> set[str]:
    """Every autocdc module imported anywhere in ``tree``, in functions too; a name taken
    from a module is named in it (``from autocdc.engine import col``: ``autocdc.engine.col``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name == "autocdc" or name.startswith("autocdc.")}


def _allowed(layer: tuple[str, ...], name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in layer)


def _past_a_face(module: str, name: str) -> bool:
    """Whether ``name``, imported by ``module`` of a layer above the faces, is one of their
    modules or anything but what their package exports (the faces' own modules import
    each other's freely, downward)."""
    face = next((f for f in FACES if _allowed((f,), name)), None)
    if _allowed(FACES, module) or face is None or name == face:
        return False
    return name.removeprefix(face + ".") not in importlib.import_module(face).__all__


def test_layers_import_downward_only() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module(path)
        layer = next((v for k, v in ALLOWED.items() if _allowed((k,), module)), None)
        if layer is None:  # the package root and `__main__`: they compose the layers
            continue
        tree = ast.parse(path.read_text(), str(path))
        upward += [
            f"{module} imports {n}"
            for n in sorted(_imports(tree))
            if not _allowed(layer, n) or _past_a_face(module, n)
        ]
    assert upward == []


def test_the_rule_sees_an_upward_import_inside_a_function() -> None:
    tree = ast.parse("def f():\n    import autocdc\n    from autocdc.sources import register\n")
    names = _imports(tree)
    assert names == {"autocdc", "autocdc.sources.register"}
    assert [n for n in sorted(names) if not _allowed(ALLOWED["autocdc.engine"], n)] == [
        "autocdc",
        "autocdc.sources.register",
    ]


def test_runtime_is_the_lowest_layer_and_the_engine_sits_on_it() -> None:
    assert not _allowed(ALLOWED["autocdc.runtime"], "autocdc.engine.tables.col")
    assert _allowed(ALLOWED["autocdc.engine"], "autocdc.runtime.warehouse.quote")


def test_above_the_engine_only_the_packages_exports_are_imported() -> None:
    """``from autocdc.engine import col`` (exported), never ``autocdc.engine.tables``: the
    engine's modules can move without breaking the layers above."""
    source = "from autocdc.engine import col, tables\nfrom autocdc.runtime.jars import jar_dir\n"
    names = sorted(_imports(ast.parse(source)))
    module = "autocdc.sources.debezium"
    assert [n for n in names if _past_a_face(module, n)] == [
        "autocdc.engine.tables",
        "autocdc.runtime.jars.jar_dir",
    ]
    assert not _past_a_face("autocdc.engine.flow", "autocdc.engine.tables.col")
    assert not _past_a_face("autocdc.engine.tables", "autocdc.runtime.warehouse.quote")
    assert not _past_a_face(module, "autocdc.runtime")  # `from autocdc import runtime`


def test_the_steps_of_a_run_import_downward_only() -> None:
    """A run may read what was declared, not what operations read back; operations may
    read both; declaring reads neither."""
    run, declare = ALLOWED["autocdc.pipelines.execute"], ALLOWED["autocdc.pipelines.declare"]
    assert _allowed(run, "autocdc.pipelines.declare.project")
    assert not _allowed(run, "autocdc.pipelines.operations.report")
    assert not _allowed(run, "autocdc.pipelines")  # the root (dp) composes the steps
    assert not _allowed(declare, "autocdc.pipelines.execute.graph")
    assert _allowed(ALLOWED["autocdc.pipelines.operations"], "autocdc.pipelines.execute.eventlog")


def test_no_module_of_pipelines_hides_a_function_of_dp() -> None:
    """Importing ``autocdc.pipelines.X`` sets the package's attribute ``X`` to the module,
    so a module named like a ``dp`` function (``run``) would replace it once imported."""
    root = PACKAGE / "pipelines"
    tree = ast.parse((root / "__init__.py").read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    modules = {p.stem for p in root.glob("*.py")} | {p.parent.name for p in root.glob("*/*.py")}
    assert "run" in functions and modules & functions == set()


def _subclasses(cls: type) -> list[type]:
    return [c for s in cls.__subclasses__() for c in (s, *_subclasses(s))]


def test_each_layer_has_its_error_tree_with_stable_codes() -> None:
    """Every error derives from its layer's base (what a caller catches to handle one
    layer), which derives from AutoCdcError; each concrete class has a code of its own."""
    import importlib
    import pkgutil

    from autocdc.engine.errors import EngineError
    from autocdc.pipelines.errors import PipelineError
    from autocdc.runtime.errors import AutoCdcError, SessionError
    from autocdc.sources.errors import SourceError

    for info in pkgutil.walk_packages([str(PACKAGE)], "autocdc."):
        if info.name != "autocdc.__main__":
            importlib.import_module(info.name)
    bases = {"autocdc.runtime": SessionError, "autocdc.engine": EngineError}
    bases |= {"autocdc.sources": SourceError, "autocdc.pipelines": PipelineError}
    assert AutoCdcError.__subclasses__() == list(bases.values())
    errors = [c for c in _subclasses(AutoCdcError) if c not in bases.values()]
    assert len(errors) > 60
    for error in errors:
        layer = next(b for prefix, b in bases.items() if error.__module__.startswith(prefix))
        assert issubclass(error, layer), (error, layer)
    codes = [e.error_class for e in errors]
    assert len(set(codes)) == len(codes) and "AUTOCDC_ERROR" not in codes


def test_tests_mirror_the_package_and_import_no_other_test() -> None:
    """Tests live beside the layer they test (tests/runtime, engine, sources, pipelines, the
    last in folders named as the steps of a run, declare/, execute/, operations/; e2e for
    the package as a user runs it) and share helpers through tests/support only: a test
    file importing another would run that file's tests' module code twice over."""
    tests = Path(__file__).parent
    files = sorted(tests.rglob("test_*.py"))
    layers = {"runtime", "engine", "sources", "pipelines", "e2e"}
    assert {f.relative_to(tests).parts[0] for f in files if f.parent != tests} == layers
    # tests/pipelines/<step>/ for the steps of a run (autocdc/pipelines/<step>/)
    steps = {f.parent.name for f in files if f.parent.parent == tests / "pipelines"}
    package = Path(autocdc.__file__).parent / "pipelines"
    assert steps == {d.name for d in package.iterdir() if (d / "__init__.py").exists()}
    imported = {
        f"{f.relative_to(tests)} imports {name}"
        for f in files
        for node in ast.walk(ast.parse(f.read_text()))
        for name in _module_names(node)
        if name.startswith(("test_", "conftest"))
    }
    assert imported == set()


def _module_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [node.module or ""] if isinstance(node, ast.ImportFrom) else []
