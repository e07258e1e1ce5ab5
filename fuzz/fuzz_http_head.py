"""Fuzz the builtin server's fast path parser (``edge_gateway._http11._parse_head``).

The property, differential against h11: whatever request head the fast path
takes, h11 accepts with the same method, target, headers and body length;
everything else the fast path leaves to h11 (or waits for more bytes only
while the head is incomplete). A gap between the two would be a request the
server frames differently from the HTTP library it defers to.

With atheris installed this is a libFuzzer target::

    python fuzz/fuzz_http_head.py -max_total_time=60

Without it, a plain mutation loop runs over a seed corpus of requests::

    python fuzz/fuzz_http_head.py [iterations] [seed]
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from edge_gateway._http11 import _DECLINE, _parse_head
from edge_gateway.testing.h11view import h11_view

sys.path.insert(0, str(Path(__file__).parent))
import _harness

MAX = 16 * 1024
SEEDS = [
    b"POST /v1/topics/t/records HTTP/1.1\r\nHost: 127.0.0.1:8470\r\n"
    b"Content-Type: application/json\r\nContent-Length: 27\r\n\r\n"
    b'{"records":[{"value":"x"}]}',
    b"GET /v1/topics/t/partitions/0/records?offset=0&wait_ms=100 HTTP/1.1\r\n"
    b"host: gw\r\naccept: application/vnd.edgegw.batch\r\nUser-Agent: x/1.0\r\n\r\n",
    b"POST /v1/sync HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer s3cret\r\n"
    b"Content-Length: 0\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
]


def fuzz_one_input(data: bytes) -> None:
    head = _parse_head(data, MAX)
    if head is None:
        assert b"\r\n\r\n" not in data[: MAX + 4], data
        return
    if head is _DECLINE:
        return
    view = h11_view(data[: head.end])
    assert view is not None, f"taken by the fast path, refused by h11: {data!r}"
    assert (head.method, head.target, head.headers, head.length) == view, (data, view)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    return _harness.mutate_text(
        rng,
        data,
        alphabet=b" \t:\r\n/?%0123456789aAzZ-\x00\x7f\x80\xff",
        tokens=[
            b"\r\n",
            b"Content-Length: 5\r\n",
            b"Transfer-Encoding: chunked\r\n",
            b"Host: b\r\n",
            b" ",
            b"\t",
            b":",
            b"HTTP/1.0",
            b"\r\n\r\n",
            b"\n",
        ],
        max_ops=5,
        splice=True,
    )


def _plain_loop(iterations: int, seed: int) -> None:
    _harness.plain_loop("fuzz_http_head", fuzz_one_input, SEEDS, _mutate, iterations, seed)


if __name__ == "__main__":
    _harness.main(fuzz_one_input, _plain_loop)
