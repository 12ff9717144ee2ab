"""An autocdc error keeps its class, code and params as it moves: located where a
pipeline declares its flow, and rebuilt from the text a Python worker or a query's
``raise_error`` sends to the driver."""

from __future__ import annotations

from autocdc.engine.errors import (
    DefinitionChangedError,
    InvalidSequenceValueError,
    TargetNotPartialError,
)
from autocdc.runtime.errors import raised_in_worker
from autocdc.sources.errors import DebeziumSchemaChangedError


def test_a_located_error_keeps_its_class_and_params_and_says_where():
    error = DefinitionChangedError(
        target="t", field="keys", stored="['id']", declared="['k']", remedy="r"
    )
    located = error.located("flows.sql:3", "f")
    assert type(located) is DefinitionChangedError
    assert located.params == {**error.params, "where": "flows.sql:3", "flow": "f"}
    said = str(error).removeprefix("[AUTOCDC_DEFINITION_CHANGED] ")
    assert str(located) == f"[AUTOCDC_DEFINITION_CHANGED] flows.sql:3: flow `f`: {said}"


def test_a_located_error_that_names_its_flow_keeps_it():
    error = TargetNotPartialError(flow="x", target="t", why="w", remedy="r")
    located = error.located("a.py:1", "y")
    assert located.params["flow"] == "x"
    assert str(located).startswith("[AUTOCDC_TARGET_NOT_PARTIAL] a.py:1: Flow `x` sets")


def test_an_error_sent_as_text_comes_back_with_its_class_and_params():
    in_worker = DebeziumSchemaChangedError(table="db.t", columns="e, f")
    traceback = (
        "Traceback (most recent call last):\n  ...\n"
        f"autocdc.sources.errors.DebeziumSchemaChangedError: {in_worker}\n"
    )
    by_query = InvalidSequenceValueError(value="x/y", kind="an LSN", why="not hex", example="1/A")
    raised = f"[USER_RAISED_EXCEPTION] {by_query} SQLSTATE: P0001"
    for error, text in ((in_worker, traceback), (by_query, raised)):
        rebuilt = raised_in_worker(Exception(text))
        assert type(rebuilt) is type(error)
        assert rebuilt is not None and (rebuilt.params, str(rebuilt)) == (error.params, str(error))
    assert raised_in_worker(Exception("[DIVIDE_BY_ZERO] Division by zero.")) is None
