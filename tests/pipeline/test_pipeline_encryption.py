"""The pipeline and encrypted regions: it reads with the keys it is given, and only with them.

``north`` seals its objects (its key rotated once: two key ids in its log),
``south`` ships in clear. Given north's key files, a run commits every record
of both regions, the JSON schema inferred from sealed values through the data
source; without a key the run stops before Spark starts, naming region and
key id, and commits nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _pipeline_support import local_site, merge

from edge_gateway.encryption import write_key_file
from edge_gateway.errors import MissingKey
from edge_gateway.format.crypt import WriteKey, generate_key
from edge_gateway.pipeline.bucketspec import BucketSpec
from edge_gateway.pipeline.job import JobConfig, run_job
from edge_gateway.pipeline.tables import Output, open_catalog


def _key(path: Path) -> tuple[Path, WriteKey]:
    key = generate_key()
    write_key_file(path, key)
    return path, WriteKey(path.stem, key)


def test_encrypted_region_reads_with_its_keys(spark: Any, tmp_path: Path) -> None:
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    north = local_site("north", tmp_path, bucket)
    south = local_site("south", tmp_path, bucket)
    path1, key1 = _key(tmp_path / "north-1.key")
    path2, key2 = _key(tmp_path / "north-2.key")
    north.key = key1
    north.ship("telemetry", 2, 2)
    north.key = key2  # rotated: later objects name north-2
    north.ship("telemetry", 2, 1)
    south.ship("telemetry", 1, 2)
    for name in bucket.rglob("*.egw"):
        assert b'"site": "north"' not in name.read_bytes()

    def job(*key_files: tuple[str, str]) -> JobConfig:
        return JobConfig(
            BucketSpec(str(bucket)),
            Output(wh),
            json_topics={"telemetry": None},
            key_files=key_files,
        )

    with pytest.raises(MissingKey, match="no decryption key 'north-1' for region 'north'"):
        run_job(spark, job(("north", str(path2))))
    assert not wh.exists() or not list(wh.rglob("*.parquet"))

    plan = run_job(spark, job(("north", str(path1)), ("north", str(path2))))
    result = plan.topics["telemetry"]
    assert result.committed
    assert (result.rows, result.rejects) == (len(merge(north, south)), 0)
    with open_catalog(wh, None) as cat:
        rows = cat.load_table(("edgegw", "telemetry")).scan().to_arrow().to_pylist()
    got = {(r["region"], r["partition"], r["offset"]): r["seq"] for r in rows}
    want = {(region, p, o): o for (region, _t, p, o) in merge(north, south)}
    assert got == want
    assert {r["site"] for r in rows} == {"north", "south"}
