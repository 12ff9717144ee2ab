"""Jars resolved once into a folder: two installers of one folder at once (two test workers
starting Kafka brokers on a fresh machine) resolve once and both get every jar."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from autocdc.runtime import jars

WANTED = ["org.example:a:1", "org.example:b:1"]


def test_two_installers_of_one_folder_resolve_once_and_both_get_every_jar(tmp_path, monkeypatch):
    resolutions: list[Path] = []

    def slow_resolve(ivy: Path, log: Path, wanted: list[str]) -> list[Path]:
        resolutions.append(ivy)
        (ivy / "jars").mkdir()
        time.sleep(0.3)  # long enough for the other installer to arrive meanwhile
        for name in ("a-1.jar", "b-1.jar"):
            (ivy / "jars" / name).write_text(name)
        return sorted((ivy / "jars").glob("*.jar"))

    monkeypatch.setattr(jars, "_resolve", slow_resolve)
    folder = tmp_path / "kafka-broker"
    results: list[list[Path]] = []
    installers = [
        threading.Thread(target=lambda: results.append(jars.install(folder, WANTED)))
        for _ in range(2)
    ]
    for installer in installers:
        installer.start()
    for installer in installers:
        installer.join()

    assert len(resolutions) == 1
    expected = [folder / "a-1.jar", folder / "b-1.jar"]
    assert results == [expected, expected]
    assert all(jar.read_text() == jar.name for jar in expected)
    assert jars.installed(folder, WANTED) == expected
