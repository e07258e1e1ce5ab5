"""Every standalone fuzz harness in ``fuzz/`` keeps running (a short plain-loop run each)."""

from __future__ import annotations

import pytest
from _fuzz import harnesses, load


@pytest.mark.parametrize("name", harnesses())
def test_fuzz_harness_smoke(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    load(name)._plain_loop(400, 1)
    assert "no unexpected exception" in capsys.readouterr().out
