"""moto's S3 server with the conditional-write quirks of other stores, as a real process.

Run as ``python tests/_quirky_s3.py PORT QUIRK[,QUIRK...]``: moto's own WSGI
application (what ``python -m moto.server`` serves) behind a small WSGI
middleware that changes how conditional headers reach it, served over HTTP
like moto's server. Each quirk is one that a real store has:

``bare-if-match``
    Ceph RGW 16.2 (issue 27): ``If-Match`` is compared with the bare ETag, so
    the quoted form that AWS documents never matches (412) and the bare one
    does; a missing key answers 412 too.
``ignore-multipart-condition``
    Ceph RGW 16.2: ``If-None-Match: *`` on CompleteMultipartUpload is ignored
    (the object is replaced), while PutObject honours it.
``ignore-conditions``
    s3rver: ``If-None-Match`` and ``If-Match`` are ignored everywhere.
``refuse-if-match``
    every PutObject with ``If-Match`` answers 412, whatever the ETag.

Requests are not signed-checked (moto's default), so rewriting headers is
safe. Tests start it with :func:`start_quirky_s3` (the ``quirky_s3``
fixture of tests/conftest.py); it exits on SIGTERM like moto's server.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from edge_gateway.testing.moto import MotoServer, s3_client, start_moto_server

QUIRKS = frozenset(
    {"bare-if-match", "ignore-multipart-condition", "ignore-conditions", "refuse-if-match"}
)

_PRECONDITION = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>PreconditionFailed</Code>'
    b"<Message>At least one of the pre-conditions you specified did not hold</Message>"
    b"</Error>"
)

#: One conditional write at a time (see ``quirky``).
_CONDITIONAL_WRITES = threading.Lock()

StartResponse = Callable[..., Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def _precondition_failed(start_response: StartResponse) -> list[bytes]:
    start_response(
        "412 Precondition Failed",
        [("Content-Type", "application/xml"), ("Content-Length", str(len(_PRECONDITION)))],
    )
    return [_PRECONDITION]


def quirky(app: App, quirks: frozenset[str]) -> App:
    """``app`` behind the conditional-header ``quirks``."""

    def middleware(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "")
        query = environ.get("QUERY_STRING", "")
        if_match = environ.get("HTTP_IF_MATCH")
        if method in ("PUT", "POST"):
            if "ignore-conditions" in quirks:
                environ.pop("HTTP_IF_NONE_MATCH", None)
                environ.pop("HTTP_IF_MATCH", None)
                if_match = None
            if "ignore-multipart-condition" in quirks and method == "POST" and "uploadId=" in query:
                environ.pop("HTTP_IF_NONE_MATCH", None)
            if if_match is not None and method == "PUT" and "partNumber=" not in query:
                if "refuse-if-match" in quirks:
                    return _precondition_failed(start_response)
                if "bare-if-match" in quirks:
                    if if_match.startswith('"'):
                        return _precondition_failed(start_response)
                    # moto wants it quoted: the bare value is what matched.
                    environ["HTTP_IF_MATCH"] = f'"{if_match}"'
            if "HTTP_IF_MATCH" in environ or "HTTP_IF_NONE_MATCH" in environ:
                # moto checks the condition and writes the object as two steps
                # with no lock between them (its put_object), so a racer can
                # pass the check while another's write is in between -- likelier
                # under CPU load, where a thread is descheduled between the two.
                # A real store (AWS, Ceph RGW) does both atomically; so does this
                # one, so the racing tests test the client, not moto's threads.
                with _CONDITIONAL_WRITES:
                    return list(app(environ, start_response))
        return app(environ, start_response)

    return middleware


def start_quirky_s3(log_path: Path, quirks: Iterable[str]) -> MotoServer:
    """Start this module as a server with ``quirks`` on a free port; return once it answers."""
    chosen = ",".join(sorted(quirks))
    return start_moto_server(
        log_path, command=lambda port: [sys.executable, __file__, str(port), chosen]
    )


def new_bucket_on(endpoint: str) -> str:
    """A new, empty bucket on the S3 server at ``endpoint``."""
    name = f"edgegw-test-{uuid.uuid4().hex[:16]}"
    client = s3_client(endpoint)
    try:
        client.create_bucket(Bucket=name)
    finally:
        client.close()
    return name


def main(argv: list[str]) -> None:
    port = int(argv[0])
    quirks = frozenset(q for q in argv[1].split(",") if q)
    unknown = quirks - QUIRKS
    if unknown:
        raise SystemExit(f"unknown quirks {sorted(unknown)}; known: {sorted(QUIRKS)}")
    import os
    import signal

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    os.environ.setdefault("MOTO_PORT", str(port))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        "127.0.0.1",
        port,
        quirky(app, quirks),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
