"""A Spark session set up for the pipeline.

Spark binds a non-loopback address and starts a web UI unless told
otherwise; on ``local[*]`` both are useless, so ``SPARK_LOCAL_IP`` defaults
to ``127.0.0.1`` and the UI is off. Timestamps are written to Parquet as
microseconds (not INT96) and the session's time zone is UTC, so the ``date``
partition column is the UTC date. Workers run the driver's Python.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from edge_gateway.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

BASE_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "zstd",
    "spark.sql.sources.partitionOverwriteMode": "static",
    # A task writes its few (date, region) partitions through concurrent
    # writers instead of sorting all its rows first (falls back to sorting
    # past 8): about 7% faster end to end on the bench.
    "spark.sql.maxConcurrentOutputFileWriters": "8",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
    # the job writes its own success markers (or commits to Iceberg)
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # glibc's malloc gives freed blocks above its mmap threshold back to the
    # kernel at once; the write tasks free and allocate MiB-sized buffers
    # (fetched and decompressed blocks) all the time, and page faults cost
    # them ~10% of their CPU (measured: 20-30k faults per 250k records,
    # 1-6k with these). The cost: a worker keeps up to 256 MiB of freed heap
    # for reuse. (On a cluster the executors' own processes get them too.)
    "spark.executorEnv.MALLOC_MMAP_THRESHOLD_": str(64 * 1024 * 1024),
    "spark.executorEnv.MALLOC_TRIM_THRESHOLD_": str(256 * 1024 * 1024),
}


def check_java() -> str:
    """The ``java`` Spark will run; :class:`ConfigError` with a clear message if there is none."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        raise ConfigError(
            "the pipeline needs Java 17 or later (PySpark runs on the JVM): install a JDK "
            "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return java


def make_session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "edgegw-pipeline",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A Spark session with the ``edgegw`` data source registered."""
    check_java()
    # py4j logs every connection it closes at INFO, even from __del__ at interpreter exit
    logging.getLogger("py4j").setLevel(logging.WARNING)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from edge_gateway.pipeline.source import EdgegwDataSource

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**BASE_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(EdgegwDataSource)
    return spark


class LazySession:
    """A Spark session started on first use: a run with nothing new to read starts no JVM.

    Starting Spark costs seconds and a JVM's memory; a pipeline run every
    few minutes on a quiet fleet often has nothing to read, and the plan
    (manifests and log headers) does not need Spark.
    """

    def __init__(
        self,
        master: str = DEFAULT_MASTER,
        *,
        conf: Mapping[str, str] | None = None,
        on_start: Callable[[], None] = lambda: None,
    ) -> None:
        self._master = master
        self._conf = dict(conf or {})
        self._on_start = on_start
        self._session: SparkSession | None = None

    def get(self) -> SparkSession:
        if self._session is None:
            self._on_start()
            self._session = make_session(self._master, conf=self._conf)
        return self._session

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None
