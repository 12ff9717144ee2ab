"""The one place that builds a SparkSession.

Tables are *path-backed*: every table autocdc creates lives in a folder of the
warehouse (``<warehouse>/<table>`` or ``<warehouse>/<db>.db/<table>``) and is registered
by name in the session catalog. A new session re-registers every Delta table it finds
in the warehouse, so a table created by one process is there, by name, for the next one,
without a shared metastore (an embedded Derby metastore would lock the warehouse to one
process at a time). Other engines read the same tables by path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from delta import configure_spark_with_delta_pip
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from autocdc.engine import tables

_DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

_WAREHOUSE = "spark.sql.warehouse.dir"


def _conf_dir() -> Path | None:
    """``$AUTOCDC_CONF_DIR``, else ``./conf``, else the ``conf/`` of a source checkout."""
    candidates = [os.environ.get("AUTOCDC_CONF_DIR"), "conf", Path(__file__).parents[2] / "conf"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "spark-defaults.conf").is_file():
            return Path(candidate)
    return None


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
    """A local SparkSession with Delta Lake, defaults from ``conf/spark-defaults.conf``.

    Delta's jars come from Maven Central through delta-spark's pip helper and are cached
    by ivy after the first run. ``warehouse`` defaults to ``./warehouse``. Settings in
    ``conf`` win over the file's, and ``warehouse`` over ``conf``'s.

    Under ``spark-submit`` the launcher's settings win over the file's, and Delta's jars
    must come from ``--packages io.delta:delta-spark_4.2_2.13:4.4.0``.

    >>> spark = spark_session(warehouse="/tmp/wh")            # doctest: +SKIP
    """
    # Python workers must run the interpreter (and packages) of the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings: dict[str, str] = {}
    conf_dir = _conf_dir()
    if conf_dir is not None:
        settings.update(read_conf_file(conf_dir / "spark-defaults.conf"))
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM
    if submitted:  # its settings (master, memory, --packages) win over the file's
        # SparkConf reads them from the launcher's JVM, and is empty until Python is
        # connected to it: connect first (no context is created).
        SparkContext._ensure_initialized()
        launcher = SparkConf()
        settings = {k: v for k, v in settings.items() if not launcher.contains(k)}
    settings.update(_DELTA_CONF)
    settings.update(conf or {})
    # `warehouse` wins over `conf`'s: a pipeline spec's configuration holds the warehouse
    # relative to the spec's folder (the runner passes it resolved as `warehouse`), which
    # Spark would take relative to the folder the JVM started in (spark-submit's).
    if warehouse is not None or _WAREHOUSE not in (conf or {}):
        settings[_WAREHOUSE] = str(Path(warehouse or "warehouse").resolve())

    builder = SparkSession.builder.appName(settings.pop("spark.app.name", "autocdc"))
    for key, value in settings.items():
        builder = builder.config(key, value)
    if "spark.jars.packages" not in settings and not submitted:
        builder = configure_spark_with_delta_pip(builder)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.get("autocdc.logLevel", "ERROR"))
    tables.register_warehouse_tables(spark)
    return spark
