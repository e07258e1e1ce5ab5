"""What h11 makes of a request head: the reference for the builtin server's fast path.

Used by ``tests/api/test_api_fastpath.py`` and ``fuzz/fuzz_http_head.py``.
"""

from __future__ import annotations

import h11

#: The largest head either side takes (the builtin server's limit in the tests).
MAX_HEAD = 16 * 1024

#: (method, target, headers, body length) of a request head.
HeadView = tuple[bytes, bytes, list[tuple[bytes, bytes]], int]


def h11_view(raw: bytes, max_head: int = MAX_HEAD) -> HeadView | None:
    """What h11 makes of the head at the start of ``raw``; None if it refuses it."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
    conn.receive_data(raw)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return None
    if not isinstance(event, h11.Request):
        return None
    headers = [(bytes(k), bytes(v)) for k, v in event.headers]
    lengths = [v for k, v in headers if k == b"content-length"]
    return event.method, event.target, headers, int(lengths[0]) if lengths else 0


#: A chunked request's head, for :func:`h11_chunked_body`.
CHUNKED_HEAD = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"


def h11_chunked_body(body: bytes) -> tuple[bytes, bytes] | bool | None:
    """What h11 makes of ``body`` after a chunked request head: (data, bytes after
    the body) when it ends; None if h11 refuses it; False if it waits for more."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    conn.receive_data(CHUNKED_HEAD + body)
    data = []
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                return False
            if isinstance(event, h11.Data):
                data.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(data), bytes(conn.trailing_data[0])
            elif not isinstance(event, h11.Request):
                return None
    except h11.RemoteProtocolError:
        return None
