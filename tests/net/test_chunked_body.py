"""The builtin server's chunked body decoder, sans-IO, against h11.

A chunked request body (the metadata server's head stream) is read on the
fast path by :class:`~edge_gateway.net._chunked.ChunkedDecoder` instead of
h11. It must read every body it takes as h11 reads it (the same data, the
same bytes after it), refuse whatever h11 refuses, and give the same answer
fed whole or one byte at a time.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_gateway.net._chunked import MAX_LINE, ChunkedDecoder, ChunkedError
from edge_gateway.testing.h11view import h11_chunked_body


def decode(raw: bytes, step: int) -> tuple[bytes, bytes] | bool | None:
    """(data, rest) at the end; None: refused; False: waiting for more."""
    d = ChunkedDecoder()
    out = []
    try:
        for i in range(0, len(raw), step):
            out.append(d.feed(raw[i : i + step]))
    except ChunkedError:
        return None
    return (b"".join(out), d.rest) if d.done else False


def same_as_h11(raw: bytes) -> tuple[bytes, bytes] | bool | None:
    whole = decode(raw, max(1, len(raw)))
    assert decode(raw, 1) == whole
    ref = h11_chunked_body(raw)
    if isinstance(whole, tuple):
        assert ref == whole
    if ref is None:
        assert not isinstance(whole, tuple)
    return whole


def test_report_lines_in_chunks_then_the_end_and_a_pipelined_request() -> None:
    raw = (
        b'b\r\n{"seq":42}\n\r\n16\r\n{"seq":43}\n{"seq":44}\n\r\n0\r\n\r\n'
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    assert same_as_h11(raw) == (
        b'{"seq":42}\n{"seq":43}\n{"seq":44}\n',
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    )


def test_data_comes_out_as_it_arrives() -> None:
    d = ChunkedDecoder()
    assert d.feed(b"a\r\n01234") == b"01234"
    assert d.feed(b"56789\r") == b"56789"
    assert d.feed(b"\n3\r") == b""
    assert d.feed(b"\nabc\r\n") == b"abc"
    assert not d.done
    assert d.feed(b"0\r\nX-Sum: 1\r\n\r\nnext") == b""
    assert d.done
    assert d.rest == b"next"
    assert d.feed(b" more") == b""
    assert d.rest == b"next more"


@pytest.mark.parametrize(
    "raw",
    [
        b"5;name=value;x\r\nhello\r\n0\r\n\r\n",  # extensions read over
        b"5 \t\r\nhello\r\n0\r\n\r\n",  # whitespace after the size
        b"A\r\n0123456789\r\n0\r\n\r\n",  # upper-case hex
        b"0000000005\r\nhello\r\n0\r\nA: b\r\nC:d\r\n\r\n",  # leading zeros, trailers
    ],
)
def test_valid_bodies_read_as_h11_reads_them(raw: bytes) -> None:
    assert isinstance(same_as_h11(raw), tuple)


@pytest.mark.parametrize(
    "raw",
    [
        b"x\r\nhello\r\n0\r\n\r\n",  # not hex
        b"\r\nhello\r\n0\r\n\r\n",  # no size
        b"-5\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhelloXY0\r\n\r\n",  # no CRLF after the data
        b"5\r\nhello\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",
        b"123456789012345678901\r\n",  # 21 hex digits
        b"0x5\r\nhello\r\n0\r\n\r\n",
    ],
)
def test_malformed_bodies_are_refused(raw: bytes) -> None:
    assert same_as_h11(raw) is None
    d = ChunkedDecoder()
    with pytest.raises(ChunkedError):
        d.feed(raw)
    with pytest.raises(ChunkedError, match="already malformed"):
        d.feed(b"0\r\n\r\n")


def test_an_endless_chunk_header_is_refused() -> None:
    d = ChunkedDecoder()
    d.feed(b"5" + b";" * (MAX_LINE - 1))
    with pytest.raises(ChunkedError, match="longer than"):
        d.feed(b";;")


_CHUNK = st.binary(min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(_CHUNK, max_size=6),
    upper=st.booleans(),
    ext=st.sampled_from([b"", b";a=b", b"; x", b" "]),
    trailers=st.lists(st.sampled_from([b"X-A: 1", b"b:2", b"C: d e"]), max_size=2),
    rest=st.binary(max_size=12),
)
def test_whatever_hypothesis_builds_reads_as_in_h11(
    chunks: list[bytes], upper: bool, ext: bytes, trailers: list[bytes], rest: bytes
) -> None:
    raw = b""
    for c in chunks:
        size = b"%X" % len(c) if upper else b"%x" % len(c)
        raw += size + ext + b"\r\n" + c + b"\r\n"
    raw += b"0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n" + rest
    assert same_as_h11(raw) == (b"".join(chunks), rest)
    # Every prefix waits for more (never ends early, never refuses).
    end = len(raw) - len(rest)
    for n in range(0, end, max(1, end // 7)):
        assert decode(raw[:n], max(1, n)) is False


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=40), prefix=st.sampled_from([b"", b"3\r\n", b"0\r\n"]))
def test_arbitrary_bytes_never_read_otherwise_than_h11(raw: bytes, prefix: bytes) -> None:
    same_as_h11(prefix + raw)
