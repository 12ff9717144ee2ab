"""autocdc as a user installs it: built into a wheel, installed into a fresh folder, run
from a folder that has no ``conf/``. Its sessions must run with the engine's settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from processes import ROOT, error_tail

from autocdc.runtime.session import DEFAULTS, read_conf_file

# The settings the engine's plans and tables depend on (see the defaults file's comments).
ENGINE_KEYS = [
    "spark.sql.session.timeZone",
    "spark.databricks.delta.properties.defaults.enableDeletionVectors",
    "spark.databricks.delta.merge.materializeSource",
    "spark.sql.adaptive.enabled",
    "spark.sql.constraintPropagation.enabled",
]
SESSION = """
import json, sys
import autocdc
spark = autocdc.spark_session(conf={"spark.driver.memory": "1g"})
options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
print(json.dumps({
    "module": autocdc.__file__,
    "settings": {k: spark.conf.get(k) for k in sys.argv[1:]},
    "java_options": options,
}))
"""


@pytest.mark.e2e
def test_an_installed_wheel_starts_sessions_with_the_engines_settings(tmp_path: Path) -> None:
    source = tmp_path / "source"  # build from a copy: the checkout gets no build/ folder
    shutil.copytree(ROOT / "autocdc", source / "autocdc", ignore=shutil.ignore_patterns("__py*"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site)]
    subprocess.run([*pip, str(source)], check=True, timeout=900)

    elsewhere = tmp_path / "elsewhere"  # no conf/ here, and none beside the package
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOCDC_CONF_DIR", "PYTHONPATH")}
    # Another zone than the engine's UTC: a session without the engine's settings shows it.
    env |= {"PYTHONPATH": str(site), "TZ": "America/New_York"}
    done = subprocess.run(
        [sys.executable, "-c", SESSION, *ENGINE_KEYS],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, error_tail(done.stderr)
    said = json.loads(done.stdout.splitlines()[-1])
    assert Path(said["module"]).is_relative_to(site)
    engine = read_conf_file(DEFAULTS / "spark-defaults.conf")
    assert said["settings"] == {k: engine[k] for k in ENGINE_KEYS}
    assert said["settings"]["spark.sql.session.timeZone"] == "UTC"
    installed = site / "autocdc" / "runtime" / "defaults" / "log4j2.properties"
    assert f"-Dlog4j2.configurationFile={installed.resolve()}" in said["java_options"]
    assert (elsewhere / "autocdc-logs" / "autocdc.log").is_file()


@pytest.mark.e2e
def test_an_editable_install_is_a_path_entry_and_warns_nothing(tmp_path: Path) -> None:
    """``make setup``'s ``pip install -e``: setuptools builds it without its "Editable
    installation" warning block (it prints one when it has to install an import hook), as
    one path entry: the checkout, from which autocdc imports."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "autocdc", source / "autocdc", ignore=shutil.ignore_patterns("__py*"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    prefix = tmp_path / "prefix"
    # --ignore-installed: never uninstall the autocdc this venv runs (pip would, --prefix or not)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed"]
    pip.append("--prefix")
    done = subprocess.run(
        [*pip, str(prefix), "-e", str(source)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, error_tail(done.stderr)
    assert "Warning" not in done.stderr and "!!" not in done.stderr, done.stderr
    [pth] = prefix.rglob("__editable__.autocdc-*.pth")
    assert pth.read_text().split() == [str(source.resolve())]
