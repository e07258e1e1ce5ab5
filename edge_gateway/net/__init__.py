"""The network layer that the front doors share: ``api/``, ``kafka/`` and ``metadata/``.

One package below them (it imports none of them, nor the gateway; the
``net-below-front-doors`` contract of ``lint-imports`` checks it):

* :mod:`.tls` — a server's TLS context from its certificate settings, and the
  first byte that tells TLS from plain text on a port;
* :mod:`.tlsstream` — :class:`~.tlsstream.TlsStream`, the server side of one TLS
  connection on a trio socket (the builtin HTTP server's and the Kafka listener's);
* :mod:`.http11` — :class:`~.http11.Http11Server`, edgegw's HTTP/1.1 server for
  ASGI apps on trio (h11 and a fast path for plain requests);
* :mod:`.asgi` — requests, responses and a route table for ASGI apps, without
  Starlette;
* :mod:`.http` — what every HTTP server and client of edgegw shares: listen
  addresses, keep-alive and body-read limits, :class:`~.http.ApiError`, the
  hypercorn settings.

Which HTTP server serves what, and why: ``docs/network.md``.

Nothing is imported here: import the module you need, so that a gateway loads
only what its configuration uses (the config loads :mod:`.http` alone, and it
loads neither h11 nor Starlette nor hypercorn).
"""

__all__: list[str] = []
