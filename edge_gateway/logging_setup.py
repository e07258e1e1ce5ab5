"""Structured logging: human-readable text, or one JSON object per line.

``configure_logging("info", "json")`` makes every record a JSON object with
``ts`` (RFC 3339, UTC), ``level``, ``logger``, ``msg`` and any ``extra={...}``
fields, plus ``exc`` for tracebacks — what Loki, Elasticsearch or journald's
JSON mode ingest without parsing rules.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any, TextIO

__all__ = ["JsonFormatter", "configure_logging"]

# Attributes every LogRecord has; anything else came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure_logging(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Set up the root logger once for a process (CLI entry points call this)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Third-party chatter stays at WARNING unless we debug.
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "hypercorn.access", "httpx"):
        logging.getLogger(noisy).setLevel(
            logging.DEBUG if level.lower() == "debug" else logging.WARNING
        )
