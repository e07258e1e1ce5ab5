"""The analytics pipeline: a bucket's region logs into Iceberg / Parquet tables (PySpark).

Nothing in the gateway imports this package; it needs the ``pipeline`` extra
(pyspark, pyarrow, pyiceberg) and is imported by the ``edgegw pipeline``
commands only. See ``docs/pipeline.md``.

* :mod:`.plan` — which log-object slices hold the records of a seq range (no Spark);
* :mod:`.bucketspec` — where the bucket is (picklable); reads go through
  :class:`edge_gateway.bucket.SyncBucket`, the gateway's own backends;
* :mod:`.source` — the ``edgegw`` Spark data source (Arrow batches);
* :mod:`.session` — a Spark session set up for the pipeline;
* :mod:`.job` — ``edgegw pipeline run``: incremental, exactly-once commits;
* :mod:`.compact` — rewriting small data files of a table's partitions.
"""
