"""Config loading: defaults, every error names its key, env overrides, the starter file."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from edge_gateway.config import (
    NON_CONFIG_ENV,
    GatewayConfig,
    env_overrides,
    key_source,
    load_config,
    parse_config,
    starter_config,
)
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
    from edge_gateway.encryption import EncryptionConfig

    for f in dataclasses.fields(GatewayConfig):
        if f.name in ("topics", "encryption") or f.name in _SECTIONS:
            continue
        if f"`{f.name}`" not in doc:
            missing.append(f.name)
    # [encryption] has a table per source region: `encryption.sources.<region>.key_files`.
    for f in dataclasses.fields(EncryptionConfig):
        if f"`encryption.{f.name}" not in doc:
            missing.append(f"encryption.{f.name}")
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


# ------------------------------------------------------------ the environment


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("EDGEGW_JOURNAL_FSNYC", "did you mean EDGEGW_JOURNAL_FSYNC?"),
        ("EDGEGW_API_LISTN", "did you mean EDGEGW_API_LISTEN?"),
        ("EDGEGW_REGOIN", "did you mean EDGEGW_REGION?"),
        ("EDGEGW_TOPICS", ""),
    ],
)
def test_an_unknown_environment_override_is_refused_with_a_hint(name: str, hint: str) -> None:
    # the same typo in the file is refused; in the environment it was ignored
    with pytest.raises(ConfigError) as info:
        parse_config({"region": "north"}, env={name: "always"})
    message = str(info.value)
    assert f"unknown environment variable {name}" in message
    assert hint in message
    assert "\n" not in message


def test_every_unknown_name_is_listed_and_other_variables_are_ignored() -> None:
    env = {"EDGEGW_A": "1", "EDGEGW_B": "2", "PATH": "/bin", "edgegw_x": "1", "XEDGEGW_Y": "1"}
    with pytest.raises(ConfigError, match="unknown environment variables EDGEGW_A, EDGEGW_B"):
        parse_config({"region": "north"}, env=env)


def test_variables_of_other_commands_are_not_config_errors() -> None:
    env = dict.fromkeys(NON_CONFIG_ENV, "x") | {
        "EDGEGW_API_TOKEN": "t",  # also edgegw produce/consume --token
        "EDGEGW_METADATA_URL": "http://127.0.0.1:8471",  # also edgegw topics --metadata
        "EDGEGW_METADATA_TOKEN": "m",
    }
    cfg = parse_config({"region": "north"}, env=env)
    assert cfg.metadata.url == "http://127.0.0.1:8471"


def test_every_edgegw_variable_in_the_project_is_known() -> None:
    """One list: each EDGEGW_* name the code, deploy files or docs use is a key's
    override or in NON_CONFIG_ENV, so no legitimate variable makes serve refuse."""
    root = Path(__file__).parents[2]
    files = [
        *root.glob("edge_gateway/**/*.py"),
        *root.glob("cli/**/*.py"),
        *root.glob("deploy/**/*"),
        *root.glob("docs/*.md"),
        *root.glob("scenarios/*"),
        root / "README.md",
        root / "Makefile",
    ]
    # the misspelling docs/configuration.md shows being refused
    examples = {"EDGEGW_JOURNAL_FSNYC"}
    known = env_overrides().keys() | NON_CONFIG_ENV | examples
    used: dict[str, Path] = {}
    for path in files:
        if path.is_file():
            for name in re.findall(
                r"\bEDGEGW_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")
            ):
                used.setdefault(name, path)
    assert used, "the scan found nothing"
    unknown = {
        name: str(path.relative_to(root)) for name, path in used.items() if name not in known
    }
    assert not unknown


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"EDGEGW_API_LISTEN": "256.1.1.1:8470"}, "api.listen (from EDGEGW_API_LISTEN): "),
        ({"EDGEGW_JOURNAL_FSYNC": "sometimes"}, "journal.fsync (from EDGEGW_JOURNAL_FSYNC): "),
        ({"EDGEGW_REGION": "a.b"}, "region (from EDGEGW_REGION): "),
        ({"EDGEGW_AUTO_CREATE": "yes"}, "auto_create (from EDGEGW_AUTO_CREATE): must be true"),
        (
            {"EDGEGW_MIRROR_POLL_INTERVAL_MS": "0"},
            "mirror.poll_interval_ms (from EDGEGW_MIRROR_POLL_INTERVAL_MS) must be > 0",
        ),
    ],
)
def test_an_error_says_when_the_value_came_from_the_environment(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"region": "north"}, env=env)
    assert str(info.value).startswith(message), str(info.value)


def test_an_error_about_a_file_value_does_not_blame_the_environment() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"region": "north", "journal": {"fsync": "x"}}, env={"EDGEGW_REGION": "n"})
    assert str(info.value).startswith("journal.fsync: ")
    assert key_source("api.listen", {}) == "api.listen"
    assert key_source("api.listen", {"EDGEGW_API_LISTEN": "x"}) == (
        "api.listen (from EDGEGW_API_LISTEN)"
    )


# ------------------------------------------------------------ api.listen


@pytest.mark.parametrize(
    "listen",
    [
        "127.0.0.1:8470",
        "localhost:0",
        "[::1]:8470",
        "edge-gw.example.com:65535",
        "gateway_1:80",
    ],
)
def test_listen_addresses_that_can_bind(listen: str) -> None:
    api = {"listen": listen, "token": "t" * 16}
    assert parse_config({"region": "north", "api": api}).api.listen == listen


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("256.1.1.1:8470", "'256.1.1.1' is not an IPv4 address"),
        ("1.2.3:8470", "'1.2.3' is not an IPv4 address"),
        ("127.0.0.1:65536", "the port must be a number 0..65535"),
        ("127.0.0.1:-1", "the port must be a number 0..65535"),
        ("127.0.0.1:", "the port must be a number"),
        (":8470", "is not host:port"),
        ("8470", "is not host:port"),
        ("::1:8470", "an IPv6 address goes in brackets"),
        ("[::g]:8470", "'::g' is not an IPv6 address"),
        ("bad host:8470", "'bad host' is not a host name or IP address"),
        ("-gw:8470", "'-gw' is not a host name"),
        ("a..b:8470", "'a..b' is not a host name"),
    ],
)
def test_listen_addresses_no_socket_could_bind(listen: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"region": "north", "api": {"listen": listen, "token": "t" * 16}})
    assert str(info.value).startswith("api.listen: ")
    assert message in str(info.value)


# ------------------------------------------------------------ topics and files


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("east.telemetry", "contains '.'"),
        ("a.b", "contains '.'"),
        ("-t", "must not start with '-'"),
        (".t", "must not start with '.'"),
    ],
)
def test_a_topic_of_the_topology_has_no_dot(name: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"region": "north", "topics": [{"name": name, "home": "north"}]})
    assert str(info.value).startswith("topics[0].name: ")
    assert message in str(info.value)


def test_load_errors_name_the_file_once(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    for text, message in [
        ("region = \n", "not valid TOML"),
        ('region = "north"\n[journal]\nfsync = "x"\n', "journal.fsync: "),
    ]:
        bad.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_config(bad, env={})
        assert str(info.value).startswith(f"{bad}: ")
        assert str(info.value).count("c.toml") == 1
        assert message in str(info.value)
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path, env={})


def test_the_starter_quotes_any_data_dir_and_warns_about_the_local_bucket() -> None:
    for data_dir in ('odd "name"', "C:\\edgegw\\data", "ünïcode dir"):
        cfg = parse_config(tomllib.loads(starter_config("north", data_dir)))
        assert cfg.data_dir == Path(data_dir)
    text = starter_config("north")
    assert "deleting the data directory deletes the\n# bucket too" in text


def test_topic_on_full_policy() -> None:
    from edge_gateway.journal import OnFull

    topics = [
        {"name": "alarms", "home": "north"},
        {"name": "telemetry", "home": "north", "priority": "bulk", "on_full": "drop-oldest"},
    ]
    cfg = parse_config({"region": "north", "topics": topics})
    assert cfg.local_topics()["alarms"].on_full is OnFull.BLOCK
    assert cfg.local_topics()["telemetry"].on_full is OnFull.DROP_OLDEST
    bad = [{"name": "t", "home": "north", "on_full": "drop-newest"}]
    with pytest.raises(ConfigError, match=r"topics\[0\]\.on_full: 'drop-newest' is not one of"):
        parse_config({"region": "north", "topics": bad})
