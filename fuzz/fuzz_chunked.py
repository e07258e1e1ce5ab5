"""Fuzz the builtin server's chunked body decoder (``edge_gateway.net._chunked``).

The property, differential against h11 on the same bytes after a chunked
request head: a body the decoder reads to its end, h11 reads to its end with
the same data and the same bytes after it (a pipelined request); a body h11
refuses, the decoder never reads to its end. The decoder may refuse more than
h11 (it takes a strict subset), never less. Each input is fed whole and one
byte at a time, with the same outcome.

With atheris installed this is a libFuzzer target::

    python fuzz/fuzz_chunked.py -max_total_time=60

Without it, a plain mutation loop runs over a seed corpus of bodies::

    python fuzz/fuzz_chunked.py [iterations] [seed]
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from edge_gateway.net._chunked import ChunkedDecoder, ChunkedError
from edge_gateway.testing.h11view import h11_chunked_body

sys.path.insert(0, str(Path(__file__).parent))
import _harness

SEEDS = [
    b'b\r\n{"seq":42}\n\r\n',
    b'b\r\n{"seq":42}\n\r\n0\r\n\r\n',
    b"5;ext=1\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"A \r\n0123456789\r\n0\r\nX-Trailer: yes\r\n\r\n",
    b"0\r\n\r\n",
]


def decode(data: bytes, pieces: int) -> tuple[bytes, bytes] | bool | None:
    """(data, rest) at the end; None: refused; False: waiting for more."""
    d = ChunkedDecoder()
    out = []
    step = 1 if pieces else max(1, len(data))
    try:
        for i in range(0, len(data), step):
            out.append(d.feed(data[i : i + step]))
    except ChunkedError:
        return None
    return (b"".join(out), d.rest) if d.done else False


def fuzz_one_input(data: bytes) -> None:
    whole = decode(data, 0)
    assert decode(data, 1) == whole, data
    ref = h11_chunked_body(data)
    if isinstance(whole, tuple):
        assert ref == whole, f"the decoder read a body h11 reads otherwise: {data!r} {ref!r}"
    if ref is None:
        assert not isinstance(whole, tuple), data


def _mutate(rng: random.Random, data: bytes) -> bytes:
    return _harness.mutate_text(
        rng,
        data,
        alphabet=b" \t;:\r\n0123456789aAfFgG-\x00\x7f\x80\xff",
        tokens=[b"\r\n", b"0\r\n\r\n", b"5\r\nhello\r\n", b";x", b"ffffffffffffffffffff", b"\n"],
        max_ops=5,
        splice=True,
    )


def _plain_loop(iterations: int, seed: int) -> None:
    _harness.plain_loop("fuzz_chunked", fuzz_one_input, SEEDS, _mutate, iterations, seed)


if __name__ == "__main__":
    _harness.main(fuzz_one_input, _plain_loop)
