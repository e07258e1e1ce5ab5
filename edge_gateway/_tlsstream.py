"""The server side of one TLS connection of the local API, on a trio socket.

Why not :class:`trio.SSLStream`: it writes every piece of TLS output
through ``SocketStream.send_all``, which passes through trio's scheduler
before and after the write, so a small response cost the connection's task
four trips through the run queue instead of the plain fast path's one
(profiled: docs/api.md, the TLS rows); on a busy gateway each trip waits
behind every other connection. This stream does what the plain fast path
does (``_http11._send_now``): it writes the encrypted bytes to the socket at
once and waits only when the socket cannot take them all.

The TLS itself is the standard library's (:meth:`ssl.SSLContext.wrap_bio`:
an :class:`ssl.SSLObject` between two memory BIOs). What this adds is the
I/O around it, for the way the API uses a connection: one task reads and
writes; at most one other task (a long poll's disconnect watch) reads while
it writes. Output is ordered: bytes leave the outgoing BIO only under the
send lock, in the order OpenSSL produced them. Errors are trio's: a TLS
failure is :class:`trio.BrokenResourceError` (the :class:`ssl.SSLError` as
its cause); an EOF, with or without ``close_notify``, ends the stream as
``b""`` (HTTPS servers must accept a client's truncated close, as
``https_compatible=True`` does in trio).
"""

from __future__ import annotations

import contextlib
import os
import ssl
from typing import Any, Final

import trio

__all__ = ["TlsStream"]

_READ_SIZE: Final = 64 * 1024


class TlsStream(trio.abc.Stream):
    """A server-side TLS stream over ``transport`` (call :meth:`do_handshake` first)."""

    def __init__(self, transport: trio.SocketStream, context: ssl.SSLContext) -> None:
        self.transport = transport
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._send_lock = trio.StrictFIFOLock()
        self._closed = False

    def getpeercert(self) -> dict[str, Any] | None:
        """The client's certificate (verified), or None when it sent none."""
        return self._ssl.getpeercert()

    async def do_handshake(self) -> None:
        """Complete the TLS handshake (the caller bounds how long it may take)."""
        while True:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
                continue
            except ssl.SSLError as exc:
                # Send the alert OpenSSL wrote (the client learns why), then fail.
                with contextlib.suppress(trio.BrokenResourceError):
                    await self._flush()
                raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from exc
            await self._flush()  # the last flight, session tickets
            return

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        while True:
            try:
                data = self._ssl.read(max_bytes or _READ_SIZE)
            except ssl.SSLWantReadError:
                await self._flush()  # anything the read produced (a key update's answer)
                await self._fill()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""  # close_notify, or a truncated close: the end either way
            except ssl.SSLError as exc:
                raise trio.BrokenResourceError(f"TLS error: {exc}") from exc
            if self._outgoing.pending:
                await self._flush()
            return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        try:
            self._ssl.write(data)  # into the memory BIO: never blocks
        except ssl.SSLError as exc:
            raise trio.BrokenResourceError(f"TLS error: {exc}") from exc
        await self._flush()

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Send ``close_notify`` (without waiting for the client's) and close the socket."""
        if self._closed:
            return
        self._closed = True
        try:
            # SSLWantReadError: the client's close_notify is not awaited.
            with contextlib.suppress(ssl.SSLError):
                self._ssl.unwrap()
            with contextlib.suppress(trio.BrokenResourceError):
                await self._flush()
        finally:
            await self.transport.aclose()

    # ------------------------------------------------------------------ I/O

    async def _fill(self) -> None:
        """Feed the next bytes from the socket to the TLS object (EOF too)."""
        data = await self.transport.receive_some(_READ_SIZE)
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()

    async def _flush(self) -> None:
        """Write what the TLS object produced, in order; at once when the socket takes it."""
        if not self._outgoing.pending:
            return
        lock = self._send_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            async with lock:  # another task is writing: after it, in order
                data = self._outgoing.read()
                if data:
                    await self.transport.send_all(data)
            return
        try:
            data = self._outgoing.read()
            try:
                sent = os.write(self.transport.socket.fileno(), data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:  # EPIPE, ECONNRESET, EBADF (closed)
                raise trio.BrokenResourceError(str(exc)) from exc
            if sent < len(data):
                await self.transport.send_all(memoryview(data)[sent:])
        finally:
            lock.release()
