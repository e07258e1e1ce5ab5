"""The README's "Use it" Kafka example runs as written against a real gateway."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from _kafka_support import kafka_gateway

README = Path(__file__).resolve().parents[2] / "README.md"


def _kafka_example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    (block,) = [b for b in blocks if "bootstrap.servers" in b]
    return block


def test_readme_kafka_example_produces(tmp_path: Path) -> None:
    code = _kafka_example()
    assert '"127.0.0.1:9092"' in code
    topics = '[[topics]]\nname = "telemetry"\nhome = "north"\npartitions = 1\n'
    with kafka_gateway(tmp_path, topics=topics) as gw:
        run = subprocess.run(
            [sys.executable, "-c", code.replace("127.0.0.1:9092", gw.bootstrap)],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 0, run.stderr.decode()
        doc = gw.get("/v1/topics/telemetry/partitions/0/records?offset=0")
    assert [(r["key"], r["value"]) for r in doc["records"]] == [("sensor-1", '{"temp": 21.5}')]
