"""A chunked request body (HTTP/1.1 ``Transfer-Encoding: chunked``), decoded sans-IO.

The builtin server's fast path (:mod:`edge_gateway.net.http11`) reads the
metadata server's head stream (a long-lived chunked request, a report line
per chunk) with it instead of h11: un-chunking a piece through h11's state
machine was about half of what a report line cost the server
(docs/metadata.md). It takes the strict subset of what h11 takes, with the
same meaning, and refuses the rest (the connection then closes, as it does
when h11 refuses a body):

* a chunk header ``1*20HEXDIG [";" extension] OWS CRLF`` (extensions are
  read over and ignored, as h11 does), at most :data:`MAX_LINE` bytes;
* the chunk's data, then exactly ``CRLF``;
* after the last chunk (size 0), trailer lines ``token ":" OWS value OWS``
  (visible ASCII, no obs-fold) ending with an empty line; trailers are read
  and dropped, as the server drops h11's.

Feed bytes in any split (:meth:`ChunkedDecoder.feed`); data comes out as it
arrives, and once the body ended :attr:`ChunkedDecoder.done` is true and
:attr:`ChunkedDecoder.rest` holds the bytes after it (a pipelined request).
Malformed input raises :class:`ChunkedError` and leaves the decoder unusable.
"""

from __future__ import annotations

import re
from typing import Final, NoReturn

__all__ = ["MAX_LINE", "ChunkedDecoder", "ChunkedError"]

#: A chunk header or trailer line longer than this is refused (h11 bounds its
#: lines by the server's head limit; ours are ~10 bytes).
MAX_LINE: Final = 16 * 1024

_CHUNK_HEADER: Final = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;[^\r\n]*)?[ \t]*")
_TRAILER_LINE: Final = re.compile(
    rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[ \t]*(?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?[ \t]*"
)
#: The states: a chunk header next, data of a chunk, its CRLF, trailers, the end.
_HEADER, _DATA, _CRLF, _TRAILER, _DONE = range(5)


class ChunkedError(Exception):
    """The body is not a chunked body the server takes (the connection closes)."""


class ChunkedDecoder:
    """One chunked request body: bytes in, data out."""

    __slots__ = ("_buf", "_left", "_state", "rest")

    def __init__(self) -> None:
        self._buf = b""
        self._state = _HEADER
        self._left = 0  # bytes of the current chunk's data still to come
        #: Bytes after the body (valid once :attr:`done`).
        self.rest = b""

    @property
    def done(self) -> bool:
        """The last chunk and the trailers were read."""
        return self._state == _DONE

    def feed(self, data: bytes) -> bytes:
        """The body's data in ``data`` (and in bytes held from before), in order.

        After the end, further bytes go to :attr:`rest`.
        """
        if self._state == _DONE:
            self.rest += data
            return b""
        if self._state < 0:
            raise ChunkedError("the chunked body was already malformed")
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos = 0
        try:
            while pos < len(buf):
                state = self._state
                if state == _DATA:
                    take = min(self._left, len(buf) - pos)
                    out.append(buf[pos : pos + take])
                    pos += take
                    self._left -= take
                    if self._left == 0:
                        self._state = _CRLF
                elif state == _CRLF:
                    if len(buf) - pos < 2:
                        if buf[pos:] != b"\r":
                            self._fail(f"malformed chunk end: {buf[pos:]!r} (expected CRLF)")
                        break
                    if buf[pos : pos + 2] != b"\r\n":
                        self._fail(f"malformed chunk end: {buf[pos : pos + 2]!r} (expected CRLF)")
                    pos += 2
                    self._state = _HEADER
                else:
                    end = buf.find(b"\r\n", pos, pos + MAX_LINE + 2)
                    if end < 0:
                        if len(buf) - pos > MAX_LINE:
                            self._fail(f"chunked body line longer than {MAX_LINE} bytes")
                        break
                    line = buf[pos:end]
                    pos = end + 2
                    if state == _HEADER:
                        m = _CHUNK_HEADER.fullmatch(line)
                        if m is None:
                            self._fail(f"illegal chunk header: {line[:80]!r}")
                        self._left = int(m[1], 16)
                        self._state = _DATA if self._left else _TRAILER
                    elif not line:
                        self._state = _DONE
                        self.rest = buf[pos:]
                        pos = len(buf)
                    elif _TRAILER_LINE.fullmatch(line) is None:
                        self._fail(f"illegal trailer line: {line[:80]!r}")
        finally:
            if self._state >= 0:
                self._buf = b"" if self._state == _DONE else buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)

    def ends_in(self, data: bytes) -> bool:
        """Whether the body ends within ``data`` (its data dropped); False also
        when it is malformed."""
        try:
            self.feed(data)
        except ChunkedError:
            return False
        return self.done

    def _fail(self, message: str) -> NoReturn:
        self._state = -1
        self._buf = b""
        raise ChunkedError(message)
