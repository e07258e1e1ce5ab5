"""Every served version of the group APIs, spoken byte for byte to a real gateway.

Clients each use one version of each API; this walks them all: a raw socket
sends kio-encoded requests of version N and decodes the answers with kio's
response class of version N, so a field a version lacks (or cannot be null
in it) shows up here rather than in some older client.
"""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

import pytest
from _kafka_support import KafkaGateway, kafka_gateway
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from edge_gateway.kafka._protocol import build, request_class, response_class
from edge_gateway.kafka._registry import supported_versions

TOPICS = """
[[topics]]
name = "events"
home = "north"
partitions = 2
"""

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE, LIST = 11, 12, 13, 14, 15, 16


class Raw:
    """One Kafka connection that sends kio requests and decodes kio responses."""

    def __init__(self, gw: KafkaGateway) -> None:
        host, _, port = gw.bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("connection closed by the gateway")
            out += chunk
        return out

    def call(self, key: int, version: int, values: dict[str, Any]) -> Any:
        cls = request_class(key, version)
        assert cls is not None
        request = build(cls, values)
        self.correlation += 1
        buf = io.BytesIO()
        header_cls = cls.__header_schema__
        entity_writer(header_cls)(
            buf,
            header_cls(
                request_api_key=i16(key),
                request_api_version=i16(version),
                correlation_id=i32(self.correlation),
                client_id="raw",
            ),
        )
        entity_writer(cls)(buf, request)
        body = buf.getvalue()
        self.sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", self._read(4))
        frame = self._read(size)
        rcls = response_class(key, version)
        header, used = entity_reader(rcls.__header_schema__)(frame, 0)
        assert header.correlation_id == self.correlation
        response, n = entity_reader(rcls)(frame, used)
        assert used + n == len(frame)
        return response


def _join(raw: Raw, version: int, group: str, member_id: str = "") -> Any:
    return raw.call(
        JOIN,
        version,
        {
            "group_id": group,
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": member_id,
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"meta-" + group.encode()}],
            "reason": None,
        },
    )


def _versions(key: int) -> range:
    lo, hi = supported_versions()[key]
    return range(lo, hi + 1)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with kafka_gateway(tmp_path_factory.mktemp("versions"), topics=TOPICS) as running:
        yield running


def test_find_coordinator_every_version(gw: KafkaGateway) -> None:
    raw = Raw(gw)
    host, _, port = gw.bootstrap.rpartition(":")
    try:
        for v in _versions(FIND_COORDINATOR):
            if v >= 4:
                r = raw.call(FIND_COORDINATOR, v, {"key_type": 0, "coordinator_keys": ["g", "h"]})
                assert [(c.key, c.node_id, c.host, c.port) for c in r.coordinators] == [
                    ("g", 0, host, int(port)),
                    ("h", 0, host, int(port)),
                ]
                bad = raw.call(FIND_COORDINATOR, v, {"key_type": 1, "coordinator_keys": ["t"]})
                assert bad.coordinators[0].error_code is ErrorCode.coordinator_not_available
            else:
                r = raw.call(FIND_COORDINATOR, v, {"key": "g", "key_type": 0})
                assert (r.error_code, r.node_id, r.host, r.port) == (
                    ErrorCode.none,
                    0,
                    host,
                    int(port),
                )
    finally:
        raw.close()


@pytest.mark.parametrize("join_version", list(_versions(JOIN)))
def test_a_member_cycle_at_every_version(gw: KafkaGateway, join_version: int) -> None:
    """Join, sync, heartbeat, commit, fetch, describe, list, leave; each API at its version."""

    def at(key: int) -> int:
        versions = _versions(key)
        return min(max(join_version, versions.start), versions.stop - 1)

    group = f"g-v{join_version}"
    raw = Raw(gw)
    try:
        r = _join(raw, join_version, group)
        if join_version >= 4:
            assert r.error_code is ErrorCode.member_id_required
            assert r.member_id.startswith("raw-")
            r = _join(raw, join_version, group, r.member_id)
        assert r.error_code is ErrorCode.none
        me, gen = r.member_id, r.generation_id
        assert r.leader == me
        assert r.protocol_name == "range"
        assert [(m.member_id, bytes(m.metadata)) for m in r.members] == [
            (me, b"meta-" + group.encode())
        ]

        s = raw.call(
            SYNC,
            at(SYNC),
            {
                "group_id": group,
                "generation_id": gen,
                "member_id": me,
                "group_instance_id": None,
                "protocol_type": "consumer",
                "protocol_name": "range",
                "assignments": [{"member_id": me, "assignment": b"plan"}],
            },
        )
        assert (s.error_code, bytes(s.assignment)) == (ErrorCode.none, b"plan")

        for v in _versions(HEARTBEAT):
            h = raw.call(
                HEARTBEAT,
                v,
                {
                    "group_id": group,
                    "generation_id": gen,
                    "member_id": me,
                    "group_instance_id": None,
                },
            )
            assert h.error_code is ErrorCode.none
        stale = raw.call(
            HEARTBEAT, at(HEARTBEAT), {"group_id": group, "generation_id": gen - 1, "member_id": me}
        )
        assert stale.error_code is ErrorCode.illegal_generation

        commit_v = at(OFFSET_COMMIT)
        c = raw.call(
            OFFSET_COMMIT,
            commit_v,
            {
                "group_id": group,
                "generation_id_or_member_epoch": gen,
                "member_id": me,
                "group_instance_id": None,
                "retention_time": -1,
                "topics": [
                    {
                        "name": "events",
                        "partitions": [
                            {
                                "partition_index": 1,
                                "committed_offset": 40 + join_version,
                                "committed_leader_epoch": -1,
                                "committed_metadata": f"v{commit_v}",
                            },
                            {
                                "partition_index": 9,
                                "committed_offset": 1,
                                "committed_leader_epoch": -1,
                                "committed_metadata": None,
                            },
                        ],
                    }
                ],
            },
        )
        assert [(p.partition_index, p.error_code) for p in c.topics[0].partitions] == [
            (1, ErrorCode.none),
            (9, ErrorCode.unknown_topic_or_partition),
        ]
        fenced = raw.call(
            OFFSET_COMMIT,
            commit_v,
            {
                "group_id": group,
                "generation_id_or_member_epoch": gen + 1,
                "member_id": me,
                "retention_time": -1,
                "topics": [
                    {
                        "name": "events",
                        "partitions": [
                            {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}
                        ],
                    }
                ],
            },
        )
        assert fenced.topics[0].partitions[0].error_code is ErrorCode.illegal_generation

        for v in _versions(OFFSET_FETCH):
            topics = [{"name": "events", "partition_indexes": [0, 1]}]
            if v >= 8:
                f = raw.call(
                    OFFSET_FETCH,
                    v,
                    {
                        "groups": [
                            {
                                "group_id": group,
                                "member_id": None,
                                "member_epoch": -1,
                                "topics": topics,
                            }
                        ],
                        "require_stable": False,
                    },
                )
                (fg,) = f.groups
                parts = fg.topics[0].partitions
            else:
                f = raw.call(
                    OFFSET_FETCH,
                    v,
                    {"group_id": group, "topics": topics, "require_stable": False},
                )
                parts = f.topics[0].partitions
            assert [(p.partition_index, p.committed_offset, p.metadata) for p in parts] == [
                (0, -1, ""),
                (1, 40 + join_version, f"v{commit_v}"),
            ]

        d = raw.call(
            DESCRIBE,
            at(DESCRIBE),
            {"groups": [group], "include_authorized_operations": False},
        )
        (dg,) = d.groups
        assert (dg.group_state, dg.protocol_data) == ("Stable", "range")
        assert [(m.member_id, m.client_id, bytes(m.member_assignment)) for m in dg.members] == [
            (me, "raw", b"plan")
        ]
        listed = raw.call(LIST, at(LIST), {"states_filter": [], "types_filter": []})
        assert group in {g.group_id for g in listed.groups}

        leave_v = at(LEAVE)
        if leave_v >= 3:
            lv = raw.call(
                LEAVE,
                leave_v,
                {
                    "group_id": group,
                    "members": [
                        {"member_id": me, "group_instance_id": None, "reason": None},
                        {"member_id": "nobody", "group_instance_id": None, "reason": None},
                    ],
                },
            )
            assert lv.error_code is ErrorCode.none
            assert [(m.member_id, m.error_code) for m in lv.members] == [
                (me, ErrorCode.none),
                ("nobody", ErrorCode.unknown_member_id),
            ]
        else:
            lv = raw.call(LEAVE, leave_v, {"group_id": group, "member_id": me})
            assert lv.error_code is ErrorCode.none
        gone = raw.call(
            HEARTBEAT, at(HEARTBEAT), {"group_id": group, "generation_id": gen, "member_id": me}
        )
        assert gone.error_code is ErrorCode.unknown_member_id
    finally:
        raw.close()
    # The Kafka commit is the HTTP API's too.
    with gw.http() as http:
        doc = http.get(f"/v1/groups/{group}/offsets").json()
    assert [(o["topic"], o["partition"], o["offset"], o["metadata"]) for o in doc["offsets"]] == [
        ("events", 1, 40 + join_version, f"v{commit_v}")
    ]


def test_static_membership_is_refused(gw: KafkaGateway) -> None:
    raw = Raw(gw)
    try:
        r = raw.call(
            JOIN,
            5,
            {
                "group_id": "static",
                "session_timeout": 10_000,
                "rebalance_timeout": 10_000,
                "member_id": "",
                "group_instance_id": "host-1",
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            },
        )
        assert r.error_code is ErrorCode.invalid_request
    finally:
        raw.close()
    assert "static membership is not supported" in gw.tail()
