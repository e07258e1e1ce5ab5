"""deploy/install.sh, the systemd units and the Kubernetes manifests.

install.sh runs for real on this machine: a venv built by pip from this
checkout, a system user, a starter config from ``edgegw init``, the unit with
the paths filled in (checked by ``systemd-analyze verify``), and the gateway
it installed started as that user, answering ``/healthz``. All of it under
a scratch directory (``--prefix``, ``--config-dir``, ``--data-dir``,
``--unit-dir``, ``--user``) and with ``--no-start`` (which leaves systemd
alone) but for the first install, which never starts anything: the
machine's own /etc, /opt and services are left alone. Then a second run must keep config
and data, ``--uninstall`` must keep them too, and ``--purge`` removes them.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from edge_gateway.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
INSTALL = DEPLOY / "install.sh"


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: apt-get install {package} (make pytest installs it)"
    return path


def _is_debian_like() -> bool:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return False
    return any(w in text for w in ("debian", "ubuntu", "raspbian"))


def _install(
    *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


def _wheel_of_version(version: str, into: Path) -> None:
    """A wheel of this checkout numbered ``version``: a release on a package index."""
    src = into / "src"
    for part in ("edge_gateway", "cli"):
        shutil.copytree(
            ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(ROOT / name, src / name)
    init = src / "edge_gateway" / "__init__.py"
    text = init.read_text()
    assert '\n__version__ = "' in text
    head, _, rest = text.partition('\n__version__ = "')
    init.write_text(head + f'\n__version__ = "{version}' + rest[rest.index('"') :])
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(into), str(src)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr


# -------------------------------------------------------------- static checks


def test_shellcheck_passes_on_the_deploy_scripts() -> None:
    shellcheck = _tool("shellcheck", "shellcheck")
    scripts = sorted(DEPLOY.glob("*.sh"))
    assert INSTALL in scripts
    run = subprocess.run(
        [shellcheck, "--severity=style", *map(str, scripts)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_install_refuses_bad_options_before_touching_anything() -> None:
    for args, message in [
        (["--bogus"], "unknown option: --bogus"),
        (["--region"], "--region needs a value"),
        (["--purge"], "--purge goes with --uninstall"),
        (["--version", "1", "--from", "."], "--version and --from exclude each other"),
        (["--prefix", "relative/dir"], "paths must be absolute"),
    ]:
        run = _install(*args, timeout=30)
        assert run.returncode == 1, (args, run.stdout, run.stderr)
        assert message in run.stderr, (args, run.stderr)
        assert run.stdout == ""
    usage = _install("--help", timeout=30)
    assert usage.returncode == 0
    assert "--uninstall" in usage.stdout


def test_the_k8s_manifests_pass_the_kubernetes_schemas() -> None:
    docs = [
        d
        for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d
    ]
    version = kubernetes_validate.latest_version()
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
    # The validator is not a rubber stamp: a wrong type and an unknown field are refused.
    broken = copy.deepcopy(next(d for d in docs if d["kind"] == "StatefulSet"))
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)
    broken = copy.deepcopy(next(d for d in docs if d["kind"] == "Service"))
    broken["spec"]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_the_k8s_manifests_hang_together(tmp_path: Path) -> None:
    docs = {
        d["kind"]: d
        for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d
    }
    sts, svc, cm = docs["StatefulSet"], docs["Service"], docs["ConfigMap"]
    # One writer per region: never more than one replica.
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["image"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert probe["port"] in ports
    assert all(p["targetPort"] in ports for p in svc["spec"]["ports"])
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    volumes |= {v["metadata"]["name"]: v for v in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert set(mounts.values()) <= volumes.keys()
    # The config the container is told to read is the ConfigMap's, and it is valid.
    args = container["args"]
    config_path = Path(args[args.index("--config") + 1])
    assert volumes[mounts[str(config_path.parent)]]["configMap"]["name"] == cm["metadata"]["name"]
    (tmp_path / config_path.name).write_text(cm["data"][config_path.name])
    # The token comes from the Secret (envFrom), as in the pod.
    config = load_config(tmp_path / config_path.name, env={"EDGEGW_API_TOKEN": "t" * 32})
    assert str(config.data_dir) in mounts
    assert volumes[mounts[str(config.data_dir)]].get("spec")  # a claim, not an emptyDir
    listen_port = int(config.api.listen.rsplit(":", 1)[1])
    assert listen_port in ports.values()


# -------------------------------------------------------------- install.sh for real


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory the service user can reach (pytest's tmp dirs are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="edgegw-install-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def service_user() -> Iterator[str]:
    name = f"edgegw-t{os.getpid()}"
    try:
        yield name
    finally:
        if (
            subprocess.run(["getent", "passwd", name], check=False, capture_output=True).returncode
            == 0
        ):
            subprocess.run(["userdel", name], check=True, timeout=30)


def _wait_for_healthz(proc: subprocess.Popen[bytes], addr_file: Path, log: Path) -> Any:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise AssertionError(
                f"the installed gateway exited {proc.returncode}: {log.read_text()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"the installed gateway did not start: {log.read_text()}")
        if addr_file.exists() and addr_file.read_text().strip():
            url = f"http://{addr_file.read_text().strip()}/healthz"
            try:
                return httpx.get(url, timeout=5).json()
            except httpx.TransportError:
                pass
        time.sleep(0.1)


@pytest.mark.slow
def test_install_start_upgrade_uninstall_purge(scratch: Path, service_user: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("install.sh needs root (it creates a system user): run the suite as root")
    if not _is_debian_like():
        pytest.skip("install.sh supports Debian-like systems only (no /etc/os-release naming one)")
    analyze = _tool("systemd-analyze", "systemd")
    prefix, etc, data, units = (scratch / d for d in ("opt", "etc", "var", "units"))
    paths = [
        f"--prefix={prefix}",
        f"--config-dir={etc}",
        f"--data-dir={data}",
        f"--unit-dir={units}",
        f"--user={service_user}",
    ]
    # Debian's own Python, as on a site: the tests' may live under /root, which the
    # service user cannot enter (install.sh refuses that; see below).
    system_python = Path("/usr/bin/python3")
    python = f"--python={system_python if system_python.exists() else sys.executable}"

    # 1. First install: needs a region.
    no_region = _install(*paths, "--no-start", python, f"--from={ROOT}", timeout=60)
    assert no_region.returncode == 1
    assert "--region NAME is needed" in no_region.stderr
    assert not prefix.exists()
    assert not data.exists()

    # Without --no-start: a first install never starts the gateway (the starter
    # config would claim the region in a bucket inside the data directory).
    first = _install(*paths, python, f"--from={ROOT}", "--region=north")
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"created system user {service_user}" in first.stdout
    assert "installed edgegw " in first.stdout
    assert f"not started: first edit {etc}/edgegw.toml" in first.stdout
    config = etc / "edgegw.toml"
    assert oct(config.stat().st_mode & 0o777) == "0o640"
    assert oct((etc / "env").stat().st_mode & 0o777) == "0o600"
    assert load_config(config, env={}).data_dir == data
    user = subprocess.run(
        ["getent", "passwd", service_user], capture_output=True, text=True, check=True
    ).stdout.split(":")
    assert user[6].strip() == "/usr/sbin/nologin"
    assert data.stat().st_uid == int(user[2])

    unit = (units / "edgegw.service").read_text()
    assert f"ExecStart={prefix}/bin/edgegw serve --config {config}\n" in unit
    assert f"User={service_user}\n" in unit
    assert f"ReadWritePaths={data}\n" in unit
    assert f"EnvironmentFile=-{etc}/env\n" in unit
    assert "StateDirectory=" not in unit  # only for a data dir under /var/lib
    assert "RestartPreventExitStatus=2 3 4\n" in unit
    verify = subprocess.run(
        [analyze, "verify", str(units / "edgegw.service")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # The sandbox: systemd's exposure score of the unit (0 best, 100 worst) is 32,
    # "OK"; without the Protect*/Restrict* lines it was 70.
    security = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=40", str(units / "edgegw.service")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert security.returncode == 0, security.stdout + security.stderr
    # The metadata server's unit, pointed at the same program.
    meta = units / "edgegw-metadata.service"
    meta.write_text(
        (DEPLOY / "edgegw-metadata.service").read_text().replace("/opt/edgegw", str(prefix))
    )
    verify = subprocess.run(
        [analyze, "verify", str(meta)], check=False, capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    meta.unlink()

    # 2. The installed gateway starts as the service user with the starter config
    #    (on a free port: the operator's one edit here).
    text = config.read_text()
    assert '# listen = "127.0.0.1:8470"' in text
    config.write_text(text.replace('# listen = "127.0.0.1:8470"', 'listen = "127.0.0.1:0"'))
    edited = config.read_bytes()
    log = scratch / "serve.log"
    with open(log, "wb") as out:
        # As the unit runs it: the service user, its group only (not via runuser,
        # which kills its child soon after passing on a SIGTERM).
        proc = subprocess.Popen(
            [f"{prefix}/bin/edgegw", "serve", "--config", str(config)],
            user=service_user,
            group=service_user,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        health = _wait_for_healthz(proc, data / "api.addr", log)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert health["status"] == "ok"
    assert health["region"] == "north"
    assert code == 0, log.read_text()
    kept = sorted(p.name for p in data.iterdir())
    assert "journal" in kept

    # 3. Again, without --region: an upgrade in place that keeps config and data.
    again = _install(*paths, "--no-start", python, f"--from={ROOT}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"kept the existing {config}" in again.stdout
    assert f"kept the existing data directory {data}" in again.stdout
    assert "upgrading the venv" in again.stdout
    assert config.read_bytes() == edited
    assert sorted(p.name for p in data.iterdir()) == kept

    # 3b. --version X: the release numbered X from the package index (here a
    #     directory of wheels standing in for it; the dependencies are in the
    #     venv already), config and data kept; a version the index lacks fails
    #     naming it, and the install before it still runs.
    index = scratch / "index"
    index.mkdir()
    _wheel_of_version("0.1.0.post900", index)
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)}
    pinned = _install(*paths, "--no-start", python, "--version=0.1.0.post900", env=offline)
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    assert "installed edgegw 0.1.0.post900 from edgegw==0.1.0.post900" in pinned.stdout
    assert config.read_bytes() == edited
    assert sorted(p.name for p in data.iterdir()) == kept
    missing = _install(*paths, "--no-start", python, "--version=9.9.9", env=offline)
    assert missing.returncode == 1
    assert "pip install edgegw==9.9.9 failed" in missing.stderr
    # As an operator runs it: a PYTHONPATH of the test run (a worktree's
    # sources) would shadow the installed package.
    still = subprocess.run(
        [f"{prefix}/bin/edgegw", "--version"],
        check=False,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    assert still.returncode == 0, still.stderr
    assert still.stdout == "edgegw 0.1.0.post900\n"

    # 4. --uninstall removes the program and the unit only.
    gone = _install(*paths, "--no-start", "--uninstall", timeout=60)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert not prefix.exists()
    assert not (units / "edgegw.service").exists()
    assert config.read_bytes() == edited
    assert sorted(p.name for p in data.iterdir()) == kept
    assert (
        subprocess.run(
            ["getent", "passwd", service_user], check=False, capture_output=True
        ).returncode
        == 0
    )

    # 5. --purge refuses a data directory that is not edgegw's, then removes
    #    config, data and the user.
    other = scratch / "other"
    other.mkdir()
    (other / "precious").write_text("not edgegw's")
    refused = _install(
        *paths, f"--data-dir={other}", "--no-start", "--uninstall", "--purge", timeout=60
    )
    assert refused.returncode == 1
    assert "does not look like an edgegw data directory" in refused.stderr
    assert (other / "precious").exists()
    assert config.exists()  # data is checked first: nothing removed
    purged = _install(*paths, "--no-start", "--uninstall", "--purge", timeout=60)
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert not etc.exists()
    assert not data.exists()
    assert (
        subprocess.run(
            ["getent", "passwd", service_user], check=False, capture_output=True
        ).returncode
        == 2
    )
