"""The hot routes' answers, rendered by hand, are byte for byte what JSONResponse renders
(heartbeat and head report answers also name the server's protocol: docs/metadata-api.md)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge_gateway.metadata.server import PROTOCOL, head_answer, heads_answer, heartbeat_answer
from edge_gateway.net.asgi import JSONResponse, Response

_INT = st.integers(min_value=0, max_value=2**63 - 1)
_NAME = st.text(min_size=1, max_size=20)


def _same(doc: object, got: Response, *, names_protocol: bool = False) -> None:
    expected = JSONResponse(doc)
    assert got.body == expected.body
    protocol = [(b"edgegw-protocol", b"%d" % PROTOCOL)] if names_protocol else []
    assert got.headers == expected.headers + protocol
    assert got.status_code == expected.status_code


@given(_INT, _INT)
def test_heartbeat_answer(version: int, now_ms: int) -> None:
    _same(
        {"routing_version": version, "server_ms": now_ms},
        heartbeat_answer(version, now_ms),
        names_protocol=True,
    )


@given(_NAME, _INT, _INT)
def test_head_report_answer(region: str, seq: int, version: int) -> None:
    _same(
        {"region": region, "seq": seq, "version": version},
        head_answer(region, seq, version),
        names_protocol=True,
    )


@given(_INT, st.dictionaries(_NAME, _INT, max_size=5))
def test_heads_answer(version: int, heads: dict[str, int]) -> None:
    _same({"version": version, "heads": heads}, heads_answer(version, heads))
