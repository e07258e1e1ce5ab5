"""Validation of topic and region names.

Names end up in file paths (journal index, data dir) and bucket keys
(``regions/<region>/...``), so the rules are strict and checked before anything
touches disk:

* 1 to 200 characters from ``[A-Za-z0-9._-]``;
* not ``.`` or ``..``, and no ``..`` anywhere (no path tricks);
* region names additionally may not contain ``.``, because a mirror topic is
  named ``<region>.<topic>`` and the first dot must separate the two.
"""

from __future__ import annotations

import re

from edge_gateway.errors import InvalidName

MAX_NAME_LENGTH = 200

_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")
_REGION_RE = re.compile(r"[A-Za-z0-9_-]+")


def validate_topic(name: object) -> str:
    """Return ``name`` if it is a valid topic name, else raise :class:`InvalidName`."""
    return _validate(name, "topic", _TOPIC_RE, "letters, digits, '.', '_' and '-'")


def validate_region(name: object) -> str:
    """Return ``name`` if it is a valid region name, else raise :class:`InvalidName`."""
    return _validate(name, "region", _REGION_RE, "letters, digits, '_' and '-'")


def mirror_topic(source_region: str, topic: str) -> str:
    """The local name of ``topic`` homed in ``source_region`` (MirrorMaker 2 style)."""
    return f"{validate_region(source_region)}.{validate_topic(topic)}"


def _validate(name: object, kind: str, pattern: re.Pattern[str], allowed: str) -> str:
    if not isinstance(name, str):
        raise InvalidName(f"{kind} name must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidName(f"{kind} name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(
            f"{kind} name is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if pattern.fullmatch(name) is None:
        bad = sorted({c for c in name if pattern.fullmatch(c) is None})
        raise InvalidName(f"{kind} name {name!r} has characters {bad!r}; allowed: {allowed}")
    if ".." in name or name == ".":
        raise InvalidName(f"{kind} name {name!r} must not be '.' or contain '..'")
    return name
