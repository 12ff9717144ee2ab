"""Declaring a flow with ``dp`` (no Spark): pyspark's calls move over unchanged, a
definition is frozen and validated once, where it is declared, and a run builds its
running flow from it without validating it again."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError
from pyspark import pipelines as pyspark_dp
from pyspark.pipelines.graph_element_registry import graph_element_registration_context

from autocdc import AutoCdcFlow, AutoCdcSnapshotFlow
from autocdc import pipelines as dp
from autocdc.engine.errors import TrackHistoryWithScd1Error
from autocdc.engine.snapshot import SnapshotDefinition
from autocdc.engine.spec import FlowDefinition
from autocdc.pipelines.declare import project, registry, scaffold
from autocdc.pipelines.errors import PipelineDefinitionError
from autocdc.pipelines.execute import graph, kinds


@pytest.fixture
def declared() -> Iterator[registry.Registry]:
    """The registry ``dp`` declares into (its SQL and Debezium parts are not used here)."""
    flows = registry.Registry(spark=None)  # type: ignore[arg-type]
    with graph_element_registration_context(flows):
        yield flows


def _parameters(function) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())


def test_pyspark_parameters_come_first_in_pysparks_order() -> None:
    """pyspark's parameters, by name and in order (positional or keyword, as in pyspark),
    then autocdc's, keyword-only."""
    theirs = [p.name for p in _parameters(pyspark_dp.create_auto_cdc_flow)]
    ours = _parameters(dp.create_auto_cdc_flow)
    assert [p.name for p in ours[: len(theirs)]] == theirs
    assert {p.kind for p in ours[: len(theirs)]} == {inspect.Parameter.POSITIONAL_OR_KEYWORD}
    assert {p.kind for p in ours[len(theirs) :]} == {inspect.Parameter.KEYWORD_ONLY}
    snapshot = [p.name for p in _parameters(dp.create_auto_cdc_from_snapshot_flow)]
    assert snapshot[:7] == [
        "target",
        "source",
        "keys",
        "stored_as_scd_type",
        "track_history_column_list",
        "track_history_except_column_list",
        "name",
    ]


def test_every_option_of_a_definition_is_a_parameter_with_its_default() -> None:
    """The signature and the definition cannot drift apart: each field is a parameter
    with the same default (pyspark's ``stored_as_scd_type=None`` means type 1)."""
    for function, definition, own in (
        (dp.create_auto_cdc_flow, FlowDefinition, {"stored_as_scd_type": None}),
        (dp.create_auto_cdc_from_snapshot_flow, SnapshotDefinition, {}),
    ):
        parameters = {p.name: p for p in _parameters(function)}
        for name, field in definition.model_fields.items():
            assert name in parameters, (function.__name__, name)
            if not field.is_required():
                expected = own.get(name, field.default)
                assert parameters[name].default == expected, (function.__name__, name)


def test_a_pyspark_call_moves_over_unchanged(declared) -> None:
    dp.create_auto_cdc_flow("t", "changes", ["id"], "seq", "op = 'D'", None, ["op"], 1, "f")
    flow = declared.flows["f"]
    assert isinstance(flow, registry.CdcFlow)
    assert (flow.target, flow.source, flow.streaming, flow.once) == ("t", "changes", True, False)
    definition = flow.definition
    assert type(definition) is FlowDefinition  # no runtime state: the engine's flow is a run's
    assert (definition.keys, definition.sequence_by, definition.apply_as_deletes) == (
        ["id"],
        "seq",
        "op = 'D'",
    )
    assert (definition.except_column_list, definition.stored_as_scd_type) == (["op"], 1)
    with pytest.raises(ValidationError):  # frozen
        definition.keys = ["other"]  # type: ignore[misc]


def test_an_unknown_argument_is_a_type_error(declared) -> None:
    with pytest.raises(TypeError, match="sequnce_by"):
        dp.create_auto_cdc_flow(target="t", source="s", keys=["id"], sequnce_by="seq")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="positional"):
        dp.create_auto_cdc_flow("t", "s", ["id"], "seq", None, None, None, 1, "f", True)  # type: ignore[misc]
    with pytest.raises(TypeError, match="max_delete"):
        dp.create_auto_cdc_from_snapshot_flow(target="t", source="s", keys=["id"], max_delete=1)  # type: ignore[call-arg]
    assert declared.flows == {}


def test_a_bad_option_is_refused_where_it_is_declared(declared) -> None:
    with pytest.raises(TrackHistoryWithScd1Error):
        dp.create_auto_cdc_flow(
            target="t", source="s", keys=["id"], track_history_column_list=["a"]
        )
    with pytest.raises(TrackHistoryWithScd1Error):  # the flow of its changes', checked too
        dp.create_auto_cdc_from_snapshot_flow(
            target="t", source="s", keys=["id"], track_history_column_list=["a"]
        )
    assert declared.flows == {}


def test_a_definition_is_validated_once(declared, monkeypatch) -> None:
    """Declared: validated; placed by a run (qualified target, the target's options, a
    partial target) and built into its running flow: not validated again."""
    checks: list[str] = []
    original = FlowDefinition._check_staleness

    def counted(self: FlowDefinition) -> None:
        checks.append(self.flow_name)
        original(self)

    monkeypatch.setattr(FlowDefinition, "_check_staleness", counted)
    dp.create_streaming_table("t", cluster_by=["id"], table_properties={"k": "v"})
    dp.create_auto_cdc_flow(target="t", source="s", keys=["id"], sequence_by="seq", name="full")
    dp.create_auto_cdc_flow(
        target="t", source="s", keys=["id"], sequence_by="seq", name="some",
        columns_to_update=["a"],
    )  # fmt: skip
    dp.create_auto_cdc_from_snapshot_flow(target="u", source="snap", keys=["id"])
    dp.create_streaming_table("u")
    assert checks == ["full", "some", "u"]  # the snapshot flow's changes, checked with it
    placed = kinds.place(declared, graph.check_targets(declared), lambda name: f"db.{name}")
    assert checks == ["full", "some", "u"]
    full, snapshot = placed["full"].engine, placed["u"].engine
    assert isinstance(full, AutoCdcFlow) and isinstance(snapshot, AutoCdcSnapshotFlow)
    assert (full.target, full.flow_name, full.partial_target) == ("db.t", "full", True)
    assert (full.cluster_by, full.table_properties) == (["id"], {"k": "v"})
    assert (snapshot.target, snapshot.flow_name) == ("db.u", "u")
    assert declared.flows["full"].definition.target == "t"  # the declaration as it was


def _sample(tmp_path: Path, import_line: str | None = None) -> project.Project:
    """``autocdc init``'s project, its Python flow given ``max_staleness`` (and its
    import replaced by ``import_line``)."""
    root = scaffold.create(tmp_path / "shop")
    flow = root / "transformations" / "customers.py"
    text = flow.read_text().replace(
        'except_column_list=["op", "seq"],',
        'except_column_list=["op", "seq"],\n    max_staleness="1 minute",',
    )
    if import_line is not None:
        text = re.sub(r"^from \S+ import pipelines as dp.*$", import_line, text, flags=re.M)
    flow.write_text(text)
    return project.load(root / "spark-pipeline.yml")


def test_the_sample_takes_autocdcs_options(tmp_path) -> None:
    """``autocdc init``'s Python flow imports autocdc's ``dp``: an autocdc option added to
    it is declared, as written."""
    loaded = registry.load(_sample(tmp_path), spark=None)  # type: ignore[arg-type]
    flow = loaded.flows["customers"]
    assert isinstance(flow, registry.CdcFlow)
    assert flow.definition.max_staleness == timedelta(minutes=1)
    assert set(loaded.flows) == {"customers", "customer_changes", "customers_history_cdc"}


def test_an_autocdc_option_given_to_pysparks_dp_says_which_import(tmp_path) -> None:
    """pyspark's ``dp`` lacks ``max_staleness``: the definition error says to import
    autocdc's, where the bare TypeError said only "Fix the library file"."""
    spec = _sample(tmp_path, "from pyspark import pipelines as dp")
    with pytest.raises(PipelineDefinitionError) as refused:
        registry.load(spec, spark=None)  # type: ignore[arg-type]
    params = refused.value.params
    lines = (spec.root / "transformations" / "customers.py").read_text().splitlines()
    call = lines.index("dp.create_auto_cdc_flow(") + 1
    assert params["where"].endswith(f"transformations/customers.py:{call}")
    assert "unexpected keyword argument 'max_staleness'" in params["problem"]
    assert "`max_staleness` is an option of autocdc's create_auto_cdc_flow" in params["hint"]
    assert "from autocdc import pipelines as dp" in params["hint"]


def test_a_keyword_neither_dp_has_keeps_the_plain_hint(tmp_path) -> None:
    spec = _sample(tmp_path, "from pyspark import pipelines as dp")
    flow = spec.root / "transformations" / "customers.py"
    flow.write_text(flow.read_text().replace("max_staleness=", "max_stalenes="))
    with pytest.raises(PipelineDefinitionError) as refused:
        registry.load(spec, spark=None)  # type: ignore[arg-type]
    assert refused.value.params["hint"] == "Fix the library file."
