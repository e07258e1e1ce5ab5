"""Validation of topic, region and consumer group names.

Names end up in file paths (journal index, data dir), bucket keys
(``regions/<region>/...``) and URL paths (``/v1/topics/<topic>/...``), so the
rules are strict and checked before anything touches disk or the network:

* topic and region names: 1 to 200 characters from ``[A-Za-z0-9._-]``; not
  ``.`` or ``..``, and no ``..`` anywhere (no path tricks);
* region names additionally may not contain ``.``, because a mirror topic is
  named ``<region>.<topic>`` and the first dot must separate the two;
* a topic *homed* in a region (``[[topics]]``, the metadata server's routing
  table, ``auto_create``) may not contain ``.`` either, for the same reason:
  then every name with a dot is a mirror topic and every name without one is
  homed somewhere, with no name that could be both (``east.telemetry`` homed
  in ``east`` would be indistinguishable from the mirror of ``telemetry``).
  It may not start with ``-`` (it would read as an option on a command line).
  :func:`validate_topic` keeps accepting dots, for mirror topic names and
  for data already written (journals and bucket objects are read with it);
  :func:`validate_home_topic` is the rule for creating a topic;
* consumer group names: 1 to 200 printable characters, no ``/``, not ``.`` or
  ``..`` (each would change the URL path the group is sent in).

This module imports nothing but :mod:`edge_gateway.errors`: the HTTP client
and the CLI use it to refuse a bad name before sending it.
"""

from __future__ import annotations

import re

from edge_gateway.errors import InvalidInput, InvalidName

__all__ = [
    "MAX_GROUP_LENGTH",
    "MAX_NAME_LENGTH",
    "mirror_topic",
    "split_mirror_topic",
    "validate_group",
    "validate_home_topic",
    "validate_region",
    "validate_topic",
]

MAX_NAME_LENGTH = 200
MAX_GROUP_LENGTH = 200

_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")
_REGION_RE = re.compile(r"[A-Za-z0-9_-]+")


def validate_topic(name: object) -> str:
    """Return ``name`` if it is a valid topic name (a topic or a mirror topic
    ``<region>.<topic>``), else raise :class:`InvalidName`."""
    return _validate(name, "topic", _TOPIC_RE, "letters, digits, '.', '_' and '-'")


def validate_home_topic(name: object) -> str:
    """Return ``name`` if a topic homed in a region may be called so, else raise
    :class:`InvalidName`: :func:`validate_topic`, and no ``.``, no leading ``-``.

    Used wherever a topic is created (static topology, metadata server,
    ``auto_create``); reads and data already written use :func:`validate_topic`.
    """
    validate_topic(name)
    assert isinstance(name, str)
    if name.startswith(("-", ".")):
        raise InvalidName(f"topic name {name!r} must not start with {name[0]!r}")
    if "." in name:
        raise InvalidName(
            f"topic name {name!r} contains '.': a topic homed in a region may not, because "
            "'.' separates region and topic in mirror topic names (<region>.<topic>)"
        )
    return name


def validate_region(name: object) -> str:
    """Return ``name`` if it is a valid region name, else raise :class:`InvalidName`."""
    return _validate(name, "region", _REGION_RE, "letters, digits, '_' and '-'")


def validate_group(name: object) -> str:
    """Return ``name`` if it is a valid consumer group name, else raise :class:`InvalidInput`.

    1 to 200 printable characters, no ``/``, not ``.`` or ``..``: the name is
    one segment of a URL path (``/v1/groups/<group>/offsets``), and servers
    decode ``%2F`` and resolve dot segments before routing.
    """
    if not isinstance(name, str):
        raise InvalidInput(f"consumer group name must be a string, got {type(name).__name__}")
    if (
        not name
        or len(name) > MAX_GROUP_LENGTH
        or not name.isprintable()
        or "/" in name
        or name in (".", "..")
    ):
        # InvalidInput, not InvalidName: the API answers it as invalid_request
        raise InvalidInput(
            f"invalid consumer group {name!r}: 1..{MAX_GROUP_LENGTH} printable characters, "
            "no '/', not '.' or '..'"
        )
    return name


def mirror_topic(source_region: str, topic: str) -> str:
    """The local name of ``topic`` homed in ``source_region`` (MirrorMaker 2 style)."""
    return f"{validate_region(source_region)}.{validate_topic(topic)}"


def split_mirror_topic(name: str) -> tuple[str, str] | None:
    """``(region, topic)`` when ``name`` has the form of a mirror topic name, else None."""
    region, dot, topic = name.partition(".")
    if not dot:
        return None
    try:
        return validate_region(region), validate_topic(topic)
    except InvalidName:
        return None


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
