"""The ``autocdc`` command line without Spark: its help, and what it refuses before a
JVM starts (no test here starts one: a refusal that needed Spark fails them)."""

from __future__ import annotations

import re

import pytest

from autocdc.pipelines import cli
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
