"""MQTT topic names, filters and the publish template: pure functions, no I/O.

The MQTT rules (MQTT 5.0, section 4.7): levels are separated by ``/``; in a
filter ``+`` stands for one whole level and ``#`` for the rest (only as the
last level); a topic name (what is published) has no wildcard; neither may be
empty or hold U+0000.
"""

from __future__ import annotations

import string

from edge_gateway.errors import InvalidInput

__all__ = [
    "TEMPLATE_FIELDS",
    "filter_matches",
    "render_topic",
    "topic_level",
    "validate_filter",
    "validate_template",
]

#: The fields a ``[[mqtt.publish]]`` topic template may use.
TEMPLATE_FIELDS = frozenset({"region", "topic", "key", "partition", "offset"})

#: The longest topic name MQTT can carry (a two-byte length prefix).
MAX_TOPIC_BYTES = 65_535


def validate_filter(text: str) -> None:
    """Raise :class:`InvalidInput` unless ``text`` is a valid MQTT topic filter."""
    if not text:
        raise InvalidInput("an MQTT topic filter may not be empty")
    if "\0" in text:
        raise InvalidInput(f"MQTT topic filter {text!r} holds U+0000")
    if len(text.encode()) > MAX_TOPIC_BYTES:
        raise InvalidInput(f"MQTT topic filter {text[:40]!r}... is longer than 65535 bytes")
    levels = text.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise InvalidInput(
                f"MQTT topic filter {text!r}: '#' must be a whole level and the last one"
            )
        if "+" in level and level != "+":
            raise InvalidInput(f"MQTT topic filter {text!r}: '+' must be a whole level")


def filter_matches(pattern: str, topic: str) -> bool:
    """Whether the topic name ``topic`` matches the filter ``pattern``.

    As brokers do, a filter starting with a wildcard does not match topics
    starting with ``$`` (``$SYS/...``).
    """
    if topic.startswith("$") and pattern[:1] in ("+", "#"):
        return False
    want = pattern.split("/")
    have = topic.split("/")
    for i, level in enumerate(want):
        if level == "#":
            return True
        if i >= len(have):
            return False
        if level != "+" and level != have[i]:
            return False
    return len(want) == len(have)


def validate_template(template: str) -> None:
    """Raise :class:`InvalidInput` unless ``template`` renders valid topic names."""
    if not template:
        raise InvalidInput("the MQTT topic template may not be empty")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise InvalidInput(f"MQTT topic template {template!r}: {exc}") from None
    for literal, name, spec, conversion in parsed:
        if "+" in literal or "#" in literal or "\0" in literal:
            raise InvalidInput(
                f"MQTT topic template {template!r}: a topic name may not hold '+', '#' or U+0000"
            )
        if name is None:
            continue
        if name not in TEMPLATE_FIELDS:
            raise InvalidInput(
                f"MQTT topic template {template!r}: unknown field {{{name}}} "
                f"(fields: {', '.join(sorted(TEMPLATE_FIELDS))})"
            )
        if spec or conversion:
            raise InvalidInput(
                f"MQTT topic template {template!r}: {{{name}}} takes no format spec or conversion"
            )


def topic_level(key: bytes | None) -> str:
    """A record key as topic text: UTF-8 with ``+``, ``#`` and U+0000 made ``_``.

    ``/`` in a key stays (a key taken from an MQTT topic name keeps its
    levels); no key is ``_``; a key that is not UTF-8 becomes its hex digits.
    """
    if key is None:
        return "_"
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return key.hex()
    return text.replace("+", "_").replace("#", "_").replace("\0", "_")


def render_topic(
    template: str, *, region: str, topic: str, key: bytes | None, partition: int, offset: int
) -> str:
    """The topic name a record is published under (``template``: see :func:`validate_template`)."""
    return template.format(
        region=region, topic=topic, key=topic_level(key), partition=partition, offset=offset
    )
