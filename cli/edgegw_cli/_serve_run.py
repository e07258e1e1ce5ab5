"""What ``edgegw serve`` does, without typer or rich: load the config, run the gateway.

:func:`main_serve` is reached two ways: from the typer command
(:mod:`edgegw_cli.serve`, for ``edgegw serve --help`` and any command line
typer must explain), and straight from :func:`edgegw_cli.app.main` for a
plain ``edgegw serve [--config PATH]``, which then starts without importing
typer (and pydantic, which typer loads) or rich. An error is printed as the
other commands print theirs (``error: ...``, :func:`edgegw_cli._common.error`,
which loads rich then: only on the way out).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from edge_gateway.net.listen import bind_failure
from edgegw_cli._errors import leaf, reason

if TYPE_CHECKING:
    from edge_gateway.config import GatewayConfig
    from edge_gateway.gateway import Gateway
    from edge_gateway.mirror import Tailer

log = logging.getLogger("edgegw.serve")

#: Longest the mirrors' start-up catch-ups put off settling the collector (see _serve).
SETTLE_WAIT_S: Final = 30.0

#: Exit codes: 0 clean shutdown, 1 a fatal error, 2 bad config, 3 fenced,
#: 4 the bucket lost this region's log (restarting cannot help: recover first).
EXIT_FATAL, EXIT_CONFIG, EXIT_FENCED, EXIT_BUCKET_LOST = 1, 2, 3, 4


class ServeFailed(Exception):
    """The gateway could not start or stopped on an error: ``message`` and the exit ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def main_serve(config: str | Path, *, verbose: bool = False) -> int:
    """``edgegw [-v] serve --config CONFIG`` without typer: the process's exit code."""
    from edge_gateway.logging_setup import configure_logging

    configure_logging("debug" if verbose else "info", "text")  # as typer's callback does
    try:
        run_serve(Path(config))
    except ServeFailed as exc:
        from edgegw_cli._common import error

        error(exc.message)
        return exc.code
    return 0


def run_serve(config: Path) -> None:
    """Run the gateway of ``config`` until SIGTERM/SIGINT; :class:`ServeFailed` on an error."""
    from edge_gateway.config import load_config
    from edge_gateway.errors import BucketLost, ConfigError, EdgeGatewayError, Fenced, InUse
    from edge_gateway.logging_setup import configure_logging

    try:
        cfg = load_config(config)  # its errors start with the file's name
    except ConfigError as exc:
        raise ServeFailed(str(exc), EXIT_CONFIG) from None
    configure_logging(cfg.log.level, cfg.log.format)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_BindFailureFilter(cfg))
    from edge_gateway import heap

    # Before any thread starts: after a drain, memory goes back (edge_gateway.heap).
    heap.tune()
    try:
        trio.run(_serve, cfg)
    except* BucketLost as group:
        msg = str(leaf(group))
        log.error("bucket lost: %s", msg)
        raise ServeFailed(f"bucket lost: {msg}", EXIT_BUCKET_LOST) from None
    except* Fenced as group:
        msg = str(leaf(group))
        log.error("fenced: %s", msg)
        raise ServeFailed(f"fenced: {msg}", EXIT_FENCED) from None
    except* InUse as group:
        msg = f"{leaf(group)}; one gateway per data directory: stop that one first"
        log.error("%s", msg)
        raise ServeFailed(msg, EXIT_FATAL) from None
    except* ConfigError as group:
        raise ServeFailed(str(leaf(group)), EXIT_CONFIG) from None
    except* (EdgeGatewayError, OSError) as group:
        message = _bind_failure(group, cfg) or reason(leaf(group))
        log.error("fatal: %s", message)
        raise ServeFailed(message, EXIT_FATAL) from None


#: The listeners serve binds: the package whose frames raise, and its config key.
_LISTENERS = (("edge_gateway.api", "api.listen"), ("edge_gateway.kafka", "kafka.listen"))


def _bind_failure(exc: BaseException, cfg: GatewayConfig) -> str | None:
    """A one-line message naming the key (``api.listen``, ``kafka.listen``) when
    ``exc`` (or the first exception in it, if a group) is a listener's bind failing.

    Exit code 1, not 2: the address is well formed (config load checks that),
    and what refuses it can pass (a process still holding the port, an
    interface not up yet at boot), so a supervisor may retry.
    """
    from edge_gateway.config import key_source

    # Only an error raised inside a listener's server: an outbound connection
    # (bucket, metadata server) can fail with the same errno or gaierror.
    # The server's frames may be on an enclosing group's traceback.
    key = None
    while True:
        tb = exc.__traceback__
        while tb is not None and key is None:
            module = str(tb.tb_frame.f_globals.get("__name__", ""))
            key = next((k for pkg, k in _LISTENERS if module.startswith(pkg + ".")), None)
            tb = tb.tb_next
        if not isinstance(exc, BaseExceptionGroup):
            break
        exc = exc.exceptions[0]
    if key is None:
        return None
    listen = cfg.api.listen if key == "api.listen" else cfg.kafka.listen
    return bind_failure(exc, key_source(key), listen)


class _BindFailureFilter(logging.Filter):
    """Log a failed bind of a listener (API, Kafka) as the one line serve prints, without the
    traceback the gateway attaches to a failed service: the operator needs the
    key and the reason, not 40 lines of trio and hypercorn frames."""

    def __init__(self, cfg: GatewayConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        message = _bind_failure(exc, self.cfg) if exc is not None else None
        if message is not None:
            record.msg, record.args = f"{record.getMessage()}: {message}", None
            record.exc_info, record.exc_text = None, None
        return True


async def _serve(cfg: GatewayConfig) -> None:
    from edge_gateway import heap, pygc
    from edge_gateway.api import serve_api
    from edge_gateway.gateway import Gateway

    gateway = Gateway(cfg)
    # The front doors attach from outside; the gateway imports none of them.
    gateway.add_service("api", serve_api)
    if cfg.kafka.enabled:
        from edge_gateway.kafka import kafka_status, serve_kafka  # loaded only when configured

        gateway.add_service("kafka", serve_kafka)
        gateway.add_status("kafka", functools.partial(kafka_status, gateway))
    if cfg.mqtt.configured:
        from edge_gateway.mqtt import attach_bridges

        # Before anything else: a missing extra is a config error, said at once.
        attach_bridges(gateway)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_on_signals, signals, gateway)
            # Free pages in the middle of the C heaps go back (edge_gateway.heap).
            nursery.start_soon(heap.keep_trimmed)

            async def announce() -> None:
                # Startup's objects frozen out of the collector's way: its full
                # collections were most of the p99 under load (edge_gateway.pygc).
                # Not while a mirror catches up from where it stopped: settling
                # stops the loop (~0.1 s: two full collections) in the middle of
                # the catch-up's fetches; it waits for the gateway's first idle
                # moment instead, or SETTLE_WAIT_S at most (with the young
                # threshold raised at once: it costs no collection).
                catching_up = [t for t in gateway.tailers.values() if not t.first_pull_ended]
                if catching_up:
                    pygc.raise_young_threshold()
                    nursery.start_soon(settle_after_first_pulls, catching_up, pygc.settle)
                else:
                    pygc.settle()
                addr = gateway.api_address
                log.info(
                    "serving region %s on %s://%s:%s",
                    cfg.region,
                    cfg.api.scheme,
                    *(addr if addr else ("?", "?")),
                )

            async def run_gateway() -> None:
                await gateway.run()  # returns when stopped, also while still starting
                nursery.cancel_scope.cancel()  # stopped: the signal watcher is done too

            gateway.on_ready(announce)
            nursery.start_soon(run_gateway)


async def settle_after_first_pulls(
    tailers: Iterable[Tailer], settle: Callable[[], None], wait_s: float = SETTLE_WAIT_S
) -> None:
    """``settle()`` once every tailer's first pull has ended, or after ``wait_s`` at most."""
    with trio.move_on_after(wait_s):
        async with trio.open_nursery() as nursery:
            for tailer in tailers:
                nursery.start_soon(tailer.wait_first_pull)
    settle()


async def _on_signals(signals: AsyncIterator[int], gateway: Gateway) -> None:
    async for signum in signals:
        if not gateway.shutdown_requested:
            log.info("%s: shutting down gracefully", signal.Signals(signum).name)
            gateway.request_shutdown()
        else:
            log.warning("second signal: exiting now")
            os._exit(EXIT_FATAL)
