"""The head stream's wire format (protocol 3), sans-IO: report lines in, ack lines out.

``POST /v1/regions/{region}/head-stream`` (docs/metadata-api.md, "Head
stream", protocol 3) carries a gateway's head reports on one long-lived
request instead of one request each. The request body is chunked and does
not end while the gateway reports: one line per report, ::

    {"seq": 42}\\n

and the response (``200``, ``application/x-ndjson``, chunked) starts at
once and answers as the lines arrive: one ack line for the lines the server
read together (one read of the socket: they are coalesced, the highest seq
applied once), ::

    {"acked": 7, "seq": 42, "version": 1732838400000123}\\n

where ``acked`` counts the lines of this stream applied so far (a gateway
that has sent N lines and reads ``acked`` >= N knows its latest report is
held), ``seq`` is the head the server holds for the region and ``version``
the relay version after it. A line the server cannot take ends the stream
with an error line, after which the server ends its response::

    {"acked": 6, "error": {"code": "invalid_json", "message": "line 7: ..."}}\\n

(the lines before it were applied: ``acked`` says how many). Codes are the
API's (``invalid_json``, ``invalid_request``, ``unauthorized``,
``forbidden``, ``unknown_region``, ``unavailable`` with ``retry_after_s``).

This module only encodes and decodes; the server's and the client's I/O
shells (``server.py``, ``client.py``) and ``bench/fleet.py`` use it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final, NoReturn

from edge_gateway.errors import CorruptData

__all__ = [
    "HEAD_STREAM_PROTOCOL",
    "MAX_ACK_LINE_BYTES",
    "MAX_REPORT_LINE_BYTES",
    "PROTOCOL_HEADER",
    "STREAM_MEDIA_TYPE",
    "Ack",
    "AckDecoder",
    "BadReportLine",
    "ReportReader",
    "encode_ack",
    "encode_error",
    "encode_report",
    "protocol_of",
    "stream_request_headers",
]

#: Media type of both directions (newline-delimited JSON).
STREAM_MEDIA_TYPE: Final = "application/x-ndjson"
#: The protocol that added the head stream.
HEAD_STREAM_PROTOCOL: Final = 3
#: Response header by which a server says which protocol it speaks (absent: 1 or 2).
PROTOCOL_HEADER: Final = "edgegw-protocol"
#: A report line is ~20 bytes; anything past this is refused.
MAX_REPORT_LINE_BYTES: Final = 256
#: An ack line is ~70 bytes, an error line a few hundred.
MAX_ACK_LINE_BYTES: Final = 4096

_REPORT: Final = re.compile(rb'\{"seq": ?(0|[1-9][0-9]{0,17})\}\r?')
_MAX_SEQ: Final = 2**63 - 1


def stream_request_headers(host: bytes, token: str | None) -> list[tuple[bytes, bytes]]:
    """The head stream request's headers, as the gateway's client sends them (and the bench)."""
    headers = [
        (b"host", host),
        (b"content-type", STREAM_MEDIA_TYPE.encode()),
        (b"transfer-encoding", b"chunked"),
        (b"user-agent", b"edgegw"),
    ]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    return headers


def encode_report(seq: int) -> bytes:
    """One report line: ``{"seq":N}`` and a newline."""
    return b'{"seq":%d}\n' % seq


def encode_ack(acked: int, seq: int, version: int) -> bytes:
    """One ack line."""
    return b'{"acked":%d,"seq":%d,"version":%d}\n' % (acked, seq, version)


def encode_error(acked: int, code: str, message: str, retry_after_s: int | None = None) -> bytes:
    """The error line that ends a stream."""
    doc: dict[str, object] = {"acked": acked, "error": {"code": code, "message": message}}
    if retry_after_s is not None:
        doc["retry_after_s"] = retry_after_s
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def protocol_of(value: str | bytes | None) -> int:
    """The protocol a server names in :data:`PROTOCOL_HEADER` (0: none, or unreadable)."""
    if value is None:
        return 0
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    return int(text) if text.isdigit() and len(text) < 6 else 0


class BadReportLine(Exception):
    """A report line the server refuses: ``code`` (``invalid_json`` or
    ``invalid_request``) and a message naming the line."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ReportReader:
    """The server's side: bytes of the request body in (any split), seqs out.

    :meth:`feed` returns the seqs of the complete lines, in order; a bad line
    raises :class:`BadReportLine` after the good lines before it in the same
    piece were counted (:attr:`lines`; take them from :attr:`good`), and
    leaves the reader unusable. Blank lines are skipped (not counted).
    """

    __slots__ = ("_broken", "_buf", "good", "lines")

    def __init__(self) -> None:
        self._buf = b""
        self._broken = False
        #: Report lines read whole and valid, since the stream's start.
        self.lines = 0
        #: The seqs of the last :meth:`feed` read before its error (if it raised).
        self.good: list[int] = []

    @property
    def pending(self) -> int:
        """Bytes of an incomplete line held."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[int]:
        if self._broken:
            raise BadReportLine("invalid_request", "the stream already had a bad line")
        buf = self._buf + data if self._buf else data
        out: list[int] = []
        self.good = out
        begin = 0
        while (end := buf.find(b"\n", begin)) >= 0:
            line = buf[begin:end]
            begin = end + 1
            m = _REPORT.fullmatch(line)
            if m is not None:
                out.append(int(m[1]))
                self.lines += 1
                continue
            seq = self._slow(line)
            if seq is not None:
                out.append(seq)
                self.lines += 1
        rest = buf[begin:]
        if len(rest) > MAX_REPORT_LINE_BYTES:
            self._fail(
                "invalid_request",
                f"line {self.lines + 1}: longer than {MAX_REPORT_LINE_BYTES} bytes",
            )
        self._buf = rest
        return out

    def end(self) -> None:
        """The body ended: a last line without its newline is refused."""
        if self._buf.strip():
            self._fail("invalid_request", f"line {self.lines + 1}: the stream ended mid-line")

    def _slow(self, line: bytes) -> int | None:
        if len(line) > MAX_REPORT_LINE_BYTES:
            self._fail(
                "invalid_request",
                f"line {self.lines + 1}: longer than {MAX_REPORT_LINE_BYTES} bytes",
            )
        if not line.strip():
            return None
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            self._fail("invalid_json", f"line {self.lines + 1}: not JSON")
        if not isinstance(doc, dict):
            self._fail("invalid_json", f"line {self.lines + 1}: not a JSON object")
        seq = doc.get("seq")
        if (
            set(doc) != {"seq"}
            or isinstance(seq, bool)
            or not isinstance(seq, int)
            or not 0 <= seq <= _MAX_SEQ
        ):
            self._fail(
                "invalid_request",
                f'line {self.lines + 1}: a report is {{"seq": <latest committed log seq>}}',
            )
        return int(seq)

    def _fail(self, code: str, message: str) -> NoReturn:
        self._broken = True
        raise BadReportLine(code, message)


@dataclass(frozen=True, slots=True)
class Ack:
    """One line of the server's answer: an ack (``error`` None) or the error that ends it."""

    acked: int
    seq: int | None = None
    version: int | None = None
    #: (code, message) of an error line.
    error: tuple[str, str] | None = None
    retry_after_s: float | None = None


class AckDecoder:
    """The client's side: bytes of the response body in (any split), :class:`Ack` out.

    A line past :data:`MAX_ACK_LINE_BYTES` or one that is not an ack or an
    error raises :class:`CorruptData` and leaves the decoder unusable.
    """

    __slots__ = ("_broken", "_buf", "where")

    def __init__(self, where: str) -> None:
        self.where = where
        self._buf = b""
        self._broken = False

    def feed(self, data: bytes) -> list[Ack]:
        if self._broken:
            raise CorruptData("ack decoder used after an error", where=self.where)
        buf = self._buf + data if self._buf else data
        out: list[Ack] = []
        begin = 0
        while (end := buf.find(b"\n", begin)) >= 0:
            line = buf[begin:end]
            begin = end + 1
            if line.strip():
                out.append(self._line(line))
        self._buf = buf[begin:]
        if len(self._buf) > MAX_ACK_LINE_BYTES:
            self._corrupt(f"ack line longer than {MAX_ACK_LINE_BYTES} bytes")
        return out

    def _line(self, line: bytes) -> Ack:
        if len(line) > MAX_ACK_LINE_BYTES:
            self._corrupt(f"ack line longer than {MAX_ACK_LINE_BYTES} bytes")
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            self._corrupt("ack line is not JSON")
        if not isinstance(doc, dict) or not _is_int(doc.get("acked")):
            self._corrupt("malformed ack line")
        error = doc.get("error")
        if error is not None:
            if not isinstance(error, dict):
                self._corrupt("malformed error line")
            after = doc.get("retry_after_s")
            return Ack(
                doc["acked"],
                error=(str(error.get("code", "error")), str(error.get("message", ""))[:500]),
                retry_after_s=float(after) if isinstance(after, int) and _is_int(after) else None,
            )
        seq, version = doc.get("seq"), doc.get("version")
        if not _is_int(seq) or not _is_int(version):
            self._corrupt("malformed ack line")
        return Ack(doc["acked"], seq, version)

    def _corrupt(self, message: str) -> NoReturn:
        self._broken = True
        raise CorruptData(message, where=self.where)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
