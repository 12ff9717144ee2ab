"""The one place that builds a SparkSession.

Tables are *path-backed*: every table autocdc creates lives in a folder of the
warehouse (:mod:`autocdc.runtime.warehouse`) and is registered by name in the session
catalog. A new session re-registers every Delta table it finds in the warehouse, so a
table created by one process is there, by name, for the next one, without a shared
metastore (an embedded Derby metastore would lock the warehouse to one process at a
time). Other engines read the same tables by path.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from autocdc.runtime import logs
from autocdc.runtime.errors import DeltaNotSubmittedError
from autocdc.runtime.warehouse import register_warehouse_tables

log = logging.getLogger("autocdc")

_DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

_WAREHOUSE = "spark.sql.warehouse.dir"
DELTA_GROUP = "io.delta"
_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


# The engine's own settings and logging, package data: an installed autocdc (a wheel, run
# from any folder) starts sessions exactly as the tested checkout does.
DEFAULTS = Path(__file__).with_name("defaults")


def _conf_dir() -> Path | None:
    """The user's overrides: ``$AUTOCDC_CONF_DIR``, else ``./conf``, if it holds a
    ``spark-defaults.conf``."""
    for candidate in (os.environ.get("AUTOCDC_CONF_DIR"), "conf"):
        if candidate and (Path(candidate) / "spark-defaults.conf").is_file():
            return Path(candidate)
    return None


def file_settings(conf_dir: Path | None) -> dict[str, str]:
    """The engine's settings, overridden by those of ``conf_dir/spark-defaults.conf``."""
    settings = read_conf_file(DEFAULTS / "spark-defaults.conf")
    if conf_dir is not None:
        settings.update(read_conf_file(conf_dir / "spark-defaults.conf"))
    return settings


def read_conf_file(path: Path) -> dict[str, str]:
    """Parse a ``spark-defaults.conf`` style file: ``key value`` per line, ``#`` comments."""
    conf: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            conf[key] = value.strip()
    return conf


def spark_session(
    warehouse: str | os.PathLike[str] | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A local SparkSession with Delta Lake, with the engine's settings (see ``DEFAULTS``)
    overridden by the user's ``conf/spark-defaults.conf``.

    Delta's jars come from the virtualenv when ``python -m autocdc.runtime.jars`` (``make
    setup``) put them there; otherwise ivy resolves them from Maven Central at start
    (through delta-spark's pip helper). ``warehouse`` defaults to ``./warehouse``.
    Settings in ``conf`` win over the file's, and ``warehouse`` over ``conf``'s.

    Spark's logs and the JVM's own output go to a log file (see ``autocdc.runtime.logs``),
    not to the terminal.

    Under ``spark-submit`` the launcher's settings (and logging) win over the file's, and
    Delta's jars must come from ``--packages io.delta:delta-spark_4.2_2.13:4.4.0``
    (else :class:`DeltaNotSubmittedError`).

    >>> spark = spark_session(warehouse="/tmp/wh")            # doctest: +SKIP
    """
    # Python workers must run the interpreter (and packages) of the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf_dir = _conf_dir()
    settings = file_settings(conf_dir)
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM
    if submitted:  # its settings (master, memory, --packages) win over the file's
        # SparkConf reads them from the launcher's JVM, and is empty until Python is
        # connected to it: connect first (no context is created).
        SparkContext._ensure_initialized()
        _check_delta_submitted()
        launcher = SparkConf()
        settings = {k: v for k, v in settings.items() if not launcher.contains(k)}
    settings.update(_DELTA_CONF)
    settings.update(conf or {})
    # `warehouse` wins over `conf`'s: a pipeline spec's configuration holds the warehouse
    # relative to the spec's folder (the runner passes it resolved as `warehouse`), which
    # Spark would take relative to the folder the JVM started in (spark-submit's).
    if warehouse is not None or _WAREHOUSE not in (conf or {}):
        settings[_WAREHOUSE] = str(Path(warehouse or "warehouse").resolve())
    log_file = logs.path_for(settings)
    logs.use(log_file)
    if not submitted and SparkContext._gateway is None:  # no JVM yet: start it here
        _add_jars(settings)
        _driver_options(settings, conf_dir, log_file)
        _start_jvm(settings, log_file)

    # A JVM started here logs to the file at the level of the log4j2.properties; a
    # launcher's logs go to its console, so keep that to errors, from before the context
    # starts (it logs hundreds of INFO lines).
    level = settings.get("autocdc.logLevel") or ("ERROR" if submitted else None)
    if level:
        jvm = SparkContext._jvm
        assert jvm is not None  # a JVM is up: the launcher's, ours, or an earlier session's
        jvm.org.apache.spark.util.Utils.setLogLevel(
            jvm.org.apache.logging.log4j.Level.toLevel(level)
        )
    builder = SparkSession.builder.appName(settings.pop("spark.app.name", "autocdc"))
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register_warehouse_tables(spark)
    return spark


def _check_delta_submitted() -> None:
    """Raise :class:`DeltaNotSubmittedError` if spark-submit's JVM cannot load Delta's
    catalog: the session would otherwise fail with a 30-line Java trace and no hint."""
    from autocdc.runtime import jars  # see _add_jars

    jvm = SparkContext._jvm
    assert jvm is not None  # connected by _ensure_initialized
    catalog = _DELTA_CONF["spark.sql.catalog.spark_catalog"]
    if not jvm.org.apache.spark.util.Utils.classIsLoadable(catalog):
        raise DeltaNotSubmittedError(
            catalog=catalog, coordinate=jars.coordinate(), jar_dir=jars.jar_dir()
        )


def _add_jars(settings: dict[str, str]) -> None:
    """The session's jars (Delta's and Spark's Kafka connector, :mod:`autocdc.runtime.jars`)
    beside the user's (``spark.jars``, ``spark.jars.packages``), never instead of them, nor
    theirs instead of ours: the virtualenv's files, else ivy resolves our coordinates with
    the user's packages. Packages that name a Delta build themselves
    (``io.delta:delta-spark_...``) choose Delta's version: none is added."""
    # Imported here, not at the top: `python -m autocdc.runtime.jars` must be its first import.
    from autocdc.runtime import jars

    packages = [p.strip() for p in settings.get("spark.jars.packages", "").split(",") if p.strip()]
    if any(p.startswith(f"{DELTA_GROUP}:delta-spark_") for p in packages):
        return
    local = jars.installed()
    if local is None:
        log.warning(
            "autocdc: the session's jars (Delta's, Kafka's, JDBC drivers) are not installed in "
            "this environment, so ivy resolves them at every start; run "
            "`python -m autocdc.runtime.jars` once to skip that."
        )
        named = {p.rpartition(":")[0] for p in packages}
        ours = [c for c in jars.coordinates() if c.rpartition(":")[0] not in named]
        settings["spark.jars.packages"] = ",".join([*packages, *ours])
        return
    settings["spark.jars"] = ",".join(
        filter(None, [settings.get("spark.jars"), *(str(jar) for jar in local)])
    )


def _driver_options(settings: dict[str, str], conf_dir: Path | None, log_file: Path) -> None:
    """The class archive if there is one (:mod:`autocdc.runtime.archive`), and Spark's log4j
    logs to ``log_file``, configured by the user's ``conf/log4j2.properties`` if there is
    one, else by the engine's; the user's own driver options come after, so theirs win."""
    from autocdc.runtime import archive  # imports jars: see _add_jars

    config = DEFAULTS / "log4j2.properties"
    if conf_dir is not None and (conf_dir / "log4j2.properties").is_file():
        config = conf_dir / "log4j2.properties"
    options = [
        archive.java_option(),
        logs.java_options(config.resolve(), log_file),
        settings.get(_JAVA_OPTIONS),
    ]
    settings[_JAVA_OPTIONS] = " ".join(filter(None, options))


def _start_jvm(settings: Mapping[str, str], log_file: Path) -> None:
    """Start the driver JVM the way pyspark does, with its own output (JVM warnings,
    ivy's report) going to the log file; the session then connects to it."""
    launch = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    with log_file.open("ab") as out:
        gateway = launch_gateway(launch, popen_kwargs={"stdout": out, "stderr": out})
    SparkContext._ensure_initialized(gateway=gateway)
