"""Config loading: defaults, every error names its key, env overrides, the starter file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from edge_gateway.config import GatewayConfig, load_config, parse_config, starter_config
from edge_gateway.errors import ConfigError
from edge_gateway.journal import FsyncPolicy


def test_minimal_config_gets_every_default() -> None:
    cfg = parse_config({"region": "north"})
    assert cfg == GatewayConfig(region="north")
    assert cfg.journal.fsync is FsyncPolicy.INTERVAL
    assert cfg.shipper.flush_interval_ms == 250
    assert cfg.bucket.type == "local"
    assert cfg.api.listen == "127.0.0.1:8470"


def test_starter_config_is_valid_and_documents_sections() -> None:
    text = starter_config("factory-7")
    cfg = parse_config(tomllib.loads(text))
    assert cfg.region == "factory-7"
    assert [t.name for t in cfg.topics] == ["telemetry"]
    for section in ("[journal]", "[shipper]", "[bucket]", "[mirror]", "[api]", "[log]"):
        assert section in text


def test_sizes_with_units_and_topology() -> None:
    cfg = parse_config(
        {
            "region": "north",
            "journal": {"segment_bytes": "1MiB", "max_bytes": "10 MiB", "fsync": "always"},
            "topics": [
                {"name": "t", "home": "north", "partitions": 3, "subscribers": ["south"]},
                {"name": "u", "home": "south", "partitions": 2, "subscribers": "*"},
                {"name": "v", "home": "south", "subscribers": ["east"]},
            ],
        }
    )
    assert cfg.journal.segment_bytes == 1 << 20
    assert cfg.journal.max_bytes == 10 << 20
    assert cfg.journal.fsync is FsyncPolicy.ALWAYS
    assert set(cfg.local_topics()) == {"t"}
    assert set(cfg.mirrored_topics()) == {"south.u"}
    assert cfg.sources() == {"south": ["u"]}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "region: required"),
        ({"region": "a/b"}, "region"),
        ({"region": "n", "regoin": 1}, "regoin: unknown key (did you mean 'region'?)"),
        ({"region": "n", "journal": {"fsync": "sometimes"}}, "journal.fsync"),
        ({"region": "n", "journal": {"fsync_interval_ms": "fast"}}, "journal.fsync_interval_ms"),
        ({"region": "n", "journal": {"segment_bytes": "12 parsecs"}}, "journal.segment_bytes"),
        ({"region": "n", "journal": {"flush": 1}}, "journal.flush: unknown key"),
        ({"region": "n", "journal": 5}, "journal: must be a table"),
        ({"region": "n", "shipper": {"flush_interval_ms": 0}}, "shipper.flush_interval_ms"),
        ({"region": "n", "bucket": {"type": "gcs"}}, "bucket.type"),
        ({"region": "n", "bucket": {"type": "s3"}}, "bucket.bucket: required"),
        ({"region": "n", "api": {"listen": "0.0.0.0:80"}}, "api.token: required"),
        ({"region": "n", "api": {"listen": "nonsense"}}, "api.listen"),
        ({"region": "n", "mirror": {"gap_policy": "ignore"}}, "mirror.gap_policy"),
        ({"region": "n", "auto_create": "yes"}, "auto_create: must be true or false"),
        ({"region": "n", "topics": {"name": "t"}}, "topics: must be an array"),
        ({"region": "n", "topics": [{"name": "t"}]}, "topics[0].home: required"),
        ({"region": "n", "topics": [{"name": "a/b", "home": "n"}]}, "topics[0]"),
        (
            {"region": "n", "topics": [{"name": "t", "home": "n"}, {"name": "t", "home": "n"}]},
            "defined twice",
        ),
    ],
)
def test_errors_name_the_key(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert message in str(info.value)


def test_environment_overrides_secrets_and_typed_values() -> None:
    env = {
        "EDGEGW_BUCKET_SECRET_KEY": "s3cr3t",
        "EDGEGW_API_TOKEN": "12345",  # a string field stays a string
        "EDGEGW_SHIPPER_FLUSH_INTERVAL_MS": "100",
        "EDGEGW_AUTO_CREATE": "true",
        "EDGEGW_REGION": "south",
    }
    cfg = parse_config({"region": "north"}, env=env)
    assert cfg.bucket.secret_key == "s3cr3t"
    assert cfg.api.token == "12345"
    assert cfg.shipper.flush_interval_ms == 100
    assert cfg.auto_create is True
    assert cfg.region == "south"
    assert "s3cr3t" not in repr(cfg)


def test_load_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("region = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})
    good = tmp_path / "good.toml"
    good.write_text('region = "north"\ndata_dir = "data"\n')
    assert load_config(good, env={}).data_dir == tmp_path / "data"


def test_every_key_is_documented() -> None:
    import dataclasses

    from edge_gateway.config import _SECTIONS, TopicConfig

    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    missing = []
    for f in dataclasses.fields(GatewayConfig):
        if f.name not in _SECTIONS and f.name != "topics" and f"`{f.name}`" not in doc:
            missing.append(f.name)
    for section, cls in [*_SECTIONS.items(), ("topics", TopicConfig)]:
        for f in dataclasses.fields(cls):
            if f"`{section}.{f.name}`" not in doc:
                missing.append(f"{section}.{f.name}")
    assert not missing, f"undocumented config keys: {missing}"


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[2] / "deploy" / "configs").glob("*.toml")), ids=str
)
def test_sample_configs_are_valid(path: Path) -> None:
    cfg = load_config(path, env={})
    assert cfg.topics
