"""The ``autocdc`` command line without Spark: its help, and what it refuses before a
JVM starts (no test here starts one: a refusal that needed Spark fails them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autocdc.pipelines import cli
from autocdc.pipelines.declare import scaffold
from autocdc.pipelines.errors import ReplayUnknownFlowError
from autocdc.pipelines.execute import replay


def _help(capsys, *command: str) -> str:
    with pytest.raises(SystemExit) as ended:
        cli.main([*command, "--help"])
    assert ended.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal


def _options(text: str) -> dict[str, str]:
    """Each ``--option`` of a help text and what follows it, up to the next option."""
    parts = re.split(r"(?:^| )(--[a-z-]+)(?=[ ,]|$)", text.partition("options:")[2])
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_every_run_option_has_help(capsys) -> None:
    """Each of ``run``'s options says what it does (beyond its metavar)."""
    options = _options(_help(capsys, "run"))
    assert {"--full-refresh", "--full-refresh-all", "--refresh", "--replay-from"} <= set(options)
    for option, said in options.items():
        words = [w for w in said.split() if not w.isupper() and w not in ("A,B", "-h,")]
        assert len(words) >= 3, (option, said)
    assert "every dataset" in options["--full-refresh-all"]
    assert "only these datasets" in options["--refresh"]


def test_replay_help_names_every_kind_of_position(capsys) -> None:
    said = _options(_help(capsys, "run"))["--replay-from"]
    for kind in replay.KINDS:
        assert f"{kind}:" in said, kind


class _SparkStarted(Exception):
    pass


@pytest.fixture
def no_spark(monkeypatch) -> None:
    """A session asked for fails the command (exit 1), naming this."""

    def refused(*_, **__):
        raise _SparkStarted("the command started Spark")

    monkeypatch.setattr(cli, "spark_session", refused)


def _sample(tmp_path: Path, source: str | None = None) -> Path:
    """``autocdc init``'s project; ``source``: its view's read instead of the JSON files'."""
    root = scaffold.create(tmp_path / "shop")
    if source is not None:
        flow = root / "transformations" / "customers.py"
        text = flow.read_text().replace(
            'spark.readStream.schema(CHANGES).json("data/changes")', source
        )
        flow.write_text(text)
    return root / "spark-pipeline.yml"


def _run(capsys, spec: Path, *args: str) -> tuple[int, list[str]]:
    code = cli.main(["run", "--spec", str(spec), *args])
    return code, capsys.readouterr().err.splitlines()


def test_a_replay_of_a_file_source_is_refused_before_spark_starts(tmp_path, capsys, no_spark):
    """The sample reads JSON files: no positions, refused from its declarations alone
    (it took a 24 s JVM start before), with what to do instead."""
    code, said = _run(capsys, _sample(tmp_path), "--replay-from", "customers=version:1")
    assert code == 2
    assert said[0].startswith(
        "autocdc: [AUTOCDC_PIPELINE_REPLAY_UNSUPPORTED] Flow `customers` cannot be replayed: "
        "it reads files (json), which have no positions"
    )
    assert "bronze Delta table" in said[0] and "--full-refresh customers" in said[0]
    assert len(said) == 1


def test_a_replay_of_an_unknown_flow_is_refused_before_spark_starts(tmp_path, capsys, no_spark):
    code, said = _run(capsys, _sample(tmp_path), "--replay-from", "custmers=version:1")
    assert code == 2
    assert said == [
        "autocdc: "
        + str(
            ReplayUnknownFlowError(
                flow="custmers", known="customer_changes, customers, customers_history_cdc"
            )
        )
    ]


def test_a_replay_the_declarations_cannot_refuse_goes_on_to_spark(tmp_path, capsys, no_spark):
    """A flow over a Delta table (replayable), or over a view the stand-in cannot read:
    the run starts Spark and checks it there."""
    reads = ['spark.readStream.table("bronze")', 'spark.readStream.json("x").where("id > 0")']
    for i, read in enumerate(reads):
        spec = _sample(tmp_path / str(i), read)
        code, said = _run(capsys, spec, "--replay-from", "customers=version:1")
        assert (code, said[0]) == (1, "autocdc: _SparkStarted: the command started Spark"), read
