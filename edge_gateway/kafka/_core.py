"""What the Kafka listener needs of the gateway: :class:`GatewayCore`.

The listener is attached from outside (``edgegw serve`` adds it as a service);
it talks to the gateway through this interface only, so nothing here imports
``edge_gateway.gateway`` at run time. ``edge_gateway.gateway.Gateway`` is one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from edge_gateway.config import GatewayConfig
    from edge_gateway.gateway import FetchResult, ProduceResult, TopicInfo
    from edge_gateway.groups import CommittedOffset, GroupStore
    from edge_gateway.idempotence import ProducerSeq

__all__ = ["GatewayCore", "PartitionOffsets"]


class PartitionOffsets(Protocol):
    """The journal's offsets as Fetch and ListOffsets read them (the gateway's lanes)."""

    def next_offset(self, topic: str, partition: int) -> int: ...

    def first_offset(self, topic: str, partition: int) -> int: ...

    async def wait_for(self, topic: str, partition: int, offset: int) -> None: ...


class GatewayCore(Protocol):
    """The gateway as the Kafka listener and its handlers use it."""

    config: GatewayConfig
    region: str

    @property
    def ready(self) -> bool: ...

    def on_ready(self, hook: Callable[[], Awaitable[None]]) -> None: ...

    @property
    def lanes(self) -> PartitionOffsets: ...

    @property
    def groups(self) -> GroupStore: ...

    def topics(self) -> list[TopicInfo]: ...

    def describe_topic(self, topic: str) -> TopicInfo: ...

    def ensure_topic(self, topic: str) -> TopicInfo: ...

    def topic_kind(self, topic: str) -> Literal["local", "mirror"] | None: ...

    async def init_producer(
        self, producer_id: int | None = None, epoch: int | None = None
    ) -> tuple[int, int]: ...

    async def produce_batch(
        self,
        topic: str,
        partition: int,
        batch: bytes,
        *,
        ack: Literal["local", "shipped"] = "local",
        producer: ProducerSeq | None = None,
    ) -> ProduceResult: ...

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
        wait_ms: int = 0,
    ) -> FetchResult: ...

    async def commit_offsets(
        self, group: str, offsets: Sequence[tuple[str, int, int, str]]
    ) -> int: ...

    async def fetch_offsets(
        self, group: str, topic: str | None = None
    ) -> list[CommittedOffset]: ...
