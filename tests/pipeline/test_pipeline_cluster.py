"""The job on a real Spark standalone cluster (a master and a worker on 127.0.0.1).

Both are started from the pyspark package itself (``$SPARK_HOME/bin/spark-class``).
The job reads moto's S3 server: executors get the endpoint and credentials
from the job's options, not from any environment (the test strips ``AWS_*``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pipeline_support import s3_site
from test_pipeline_job import iceberg_rows

from edge_gateway.testing.ports import free_port


def _clean_env(tmp: Path) -> dict[str, str]:
    import pyspark

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYSPARK_", "SPARK_"))}
    env.update(
        SPARK_HOME=os.path.dirname(pyspark.__file__),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_WORKER_DIR=str(tmp / "worker"),
        SPARK_LOG_DIR=str(tmp / "logs"),
    )
    return env


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"spark daemon exited: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail(f"spark daemon did not listen on {port}: {log.read_text()[-2000:]}")


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    from edge_gateway.pipeline.session import check_java

    check_java()
    env = _clean_env(tmp_path)
    spark_class = os.path.join(env["SPARK_HOME"], "bin", "spark-class")
    port = free_port()
    procs: list[tuple[subprocess.Popen[bytes], object]] = []

    def start(argv: list[str], name: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"{name}.log"
        out = open(log, "wb")  # noqa: SIM115 - closed at teardown
        proc = subprocess.Popen(
            [spark_class, *argv], stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        procs.append((proc, out))
        return proc, log

    try:
        master, mlog = start(
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port()),
            ],
            "master",
        )  # fmt: skip
        _wait_port(port, master, mlog)
        url = f"spark://127.0.0.1:{port}"
        start(
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--cores", "2", "--memory", "2g",
                "--webui-port", str(free_port()), url,
            ],
            "worker",
        )  # fmt: skip
        yield url
    finally:
        for proc, out in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            out.close()  # type: ignore[attr-defined]


@pytest.mark.slow
def test_job_on_a_standalone_cluster_reading_s3(
    standalone: str, tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    north = s3_site("north", tmp_path, moto_endpoint, s3_bucket_name)
    south = s3_site("south", tmp_path, moto_endpoint, s3_bucket_name)
    north.ship("telemetry", 2, 4, headers=True)
    south.ship("telemetry", 1, 3)
    wh = tmp_path / "wh"
    env = _clean_env(tmp_path)
    argv = [
        sys.executable, "-m", "edgegw_cli", "pipeline", "run",
        "--bucket", f"s3://{s3_bucket_name}", "--endpoint-url", moto_endpoint,
        "--access-key", "testing", "--secret-key", "testing",
        "--warehouse", str(wh), "--master", standalone,
        "--conf", "spark.executor.memory=1g", "--conf", "spark.cores.max=2",
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "committed" in done.stdout
    expected = {**north.expected, **south.expected}
    assert iceberg_rows(wh, "telemetry") == expected
    # the work ran on the cluster's executor, not in a local driver
    worker_dir = tmp_path / "worker"
    assert any(worker_dir.rglob("stderr")), "no executor ran on the worker"
