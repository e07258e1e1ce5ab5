"""The bridge to the site's MQTT broker (docs/mqtt.md).

* ``[[mqtt.ingest]]``: :class:`MqttIngest` subscribes (QoS 1, persistent
  session) and journals what it receives; each PUBACK goes back only after the
  journal append holding the message is durable.
* ``[[mqtt.publish]]``: :class:`MqttPublisher` publishes topics (mirrors or
  local) into the broker at QoS 1, in offset order per partition, its progress
  kept as a consumer group.

paho-mqtt (the ``mqtt`` extra) is imported only when one is configured.
"""

from edge_gateway.mqtt._topics import (
    filter_matches,
    render_topic,
    topic_level,
    validate_filter,
    validate_template,
)

__all__ = [
    "filter_matches",
    "render_topic",
    "topic_level",
    "validate_filter",
    "validate_template",
]
