"""The bridge to the site's MQTT broker (docs/mqtt.md).

* ``[[mqtt.ingest]]``: :class:`MqttIngest` subscribes (QoS 1, persistent
  session) and journals what it receives; each PUBACK goes back only after the
  journal append holding the message is durable.
* ``[[mqtt.publish]]``: :class:`MqttPublisher` publishes topics (mirrors or
  local) into the broker at QoS 1, in offset order per partition, its progress
  kept as a consumer group.

paho-mqtt (the ``mqtt`` extra) is imported only when one is configured.
:func:`attach_bridges` wires them into a gateway (``edgegw serve`` does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_gateway.format.mqtt_topics import (
    filter_matches,
    render_topic,
    topic_level,
    validate_filter,
    validate_template,
)

if TYPE_CHECKING:
    from edge_gateway.gateway import Gateway

__all__ = [
    "attach_bridges",
    "filter_matches",
    "render_topic",
    "topic_level",
    "validate_filter",
    "validate_template",
]


def attach_bridges(gateway: Gateway) -> None:
    """Attach ``[[mqtt.ingest]]`` and ``[[mqtt.publish]]`` to ``gateway`` as services.

    Raises :class:`~edge_gateway.errors.ConfigError` when paho-mqtt is not
    installed. The bridge code (and paho) loads only here, when one is configured.
    """
    from edge_gateway.mqtt._bridge import attach

    attach(gateway)
