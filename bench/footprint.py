"""Footprint benchmark: how fast ``edgegw serve`` is ready, and how much memory it holds idle.

Usage::

    .venv/bin/python bench/footprint.py [--quick] [--runs N] [--source CHECKOUT]

Figures (docs/operations.md, "Footprint"), each next to baselines measured in
the same run:

* **start to ready**: from ``exec`` of ``edgegw serve`` (the default config:
  a local-directory bucket, one topic of 4 partitions, the default API
  server) to the first ``GET /healthz`` answered 200; min and median of N
  starts, each on a fresh data directory; also the CPU seconds the process
  used until then (less disturbed by other load on the machine than the wall
  time), and the same with ``api.server = "builtin"``;
* **idle RSS** of that gateway (``VmRSS`` from /proc) after it idled and
  was scraped once (``GET /metrics`` loads prometheus_client), and before
  that scrape;
* **RSS with 100 topics**: 100 local topics x 4 partitions, and 2 mirrored
  regions homing 100 topics x 4 partitions each (300 topics, 1200
  partitions at the gateway), idle; the growth per topic;
* **RSS with an S3 bucket** (moto's server): boto3 and botocore loaded;
* ``edgegw --help`` wall time;
* baselines: the interpreter floor (``python -c pass``: time and RSS), what
  each step of a gateway's imports adds to it (trio, the C codecs,
  prometheus_client, h11, edgegw's own modules, hypercorn), what the packages
  it no longer imports would cost, and nats-server's and mosquitto's start to
  ready and idle RSS where installed (skipped with a note otherwise).

The gateway's modules are byte-compiled first (``compileall``), as
``pip install`` leaves them: a source tree run with
``PYTHONDONTWRITEBYTECODE`` set would measure the compiler. The last line of
output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from _common import BENCH_DIR, Row, emit_json, median, progress, render_table, scratch_dir

from edge_gateway.testing.ports import free_port


def source() -> Path:
    """The checkout whose gateway is measured (``--source``; default: this one)."""
    return Path(os.environ.get("FOOTPRINT_BENCH_SOURCE") or BENCH_DIR.parent)


#: The gateway's console script next to this interpreter (``python -m edgegw_cli`` if none).
EDGEGW = Path(sys.executable).parent / "edgegw"
#: Children run here: ``python -c`` and ``-m`` put the working directory first
#: on the path, which would import this checkout over ``--source``.
NEUTRAL_CWD = "/"
#: The issue's targets (docs/operations.md, "Footprint").
READY_TARGET_S = 0.3
IDLE_RSS_TARGET_MB = 40.0
#: What a gateway on a local bucket loads, in the order it loads it: each step
#: is measured as ``python -c "import <this and every step before>"``, and its
#: cost is the increase over the step before (the floor of a Python gateway).
LOADED = (
    ("trio", ("trio",)),
    ("zstandard, sqlite3, tomllib", ("zstandard", "sqlite3", "tomllib")),
    ("h11 (the builtin server)", ("h11",)),
    ("edgegw's own modules", ("edgegw_cli._serve_run", "edge_gateway.api._server")),
    ("hypercorn (the default server)", ("hypercorn.trio",)),
    ("prometheus_client (first scrape)", ("prometheus_client",)),
)
#: What a gateway on a local bucket no longer loads, each measured alone.
NOT_LOADED = (
    "botocore.session",
    "starlette.applications",
    "typer",
    "rich.console",
    "crc32c",
)


# ------------------------------------------------------------------ processes


def child_env() -> dict[str, str]:
    """This checkout's code first on the path; byte-code caching allowed."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    paths = [str(source()), str(source() / "cli")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def edgegw_argv(*args: str) -> list[str]:
    if EDGEGW.exists():
        return [str(EDGEGW), *args]
    return [sys.executable, "-m", "edgegw_cli", *args]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_200(port: int, path: str = "/healthz") -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
            )
            return s.recv(64).split(b" ", 2)[1:2] == [b"200"]
    except (OSError, IndexError):
        return False


#: MQTT 3.1.1 CONNECT (clean session, empty client id) and the CONNACK that accepts it.
_MQTT_CONNECT = bytes([0x10, 12, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 60, 0, 0])
_MQTT_CONNACK = bytes([0x20, 2, 0, 0])


def mqtt_ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(_MQTT_CONNECT)
            return s.recv(4) == _MQTT_CONNACK
    except OSError:
        return False


class Started:
    """A server process started by :func:`start`: ready after ``ready_s``."""

    def __init__(self, proc: subprocess.Popen[bytes], ready_s: float, ready_cpu_s: float) -> None:
        self.proc = proc
        self.ready_s = ready_s
        self.ready_cpu_s = ready_cpu_s

    def idle_rss_mb(self, idle_s: float) -> float:
        time.sleep(idle_s)
        return rss_mb(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start(
    argv: Sequence[str], ready: Callable[[], bool], log: Path, env: dict[str, str] | None = None
) -> Started:
    """Exec ``argv`` and poll ``ready`` every ms or so; fails after 60 s."""
    with open(log, "ab") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv, stdout=fh, stderr=fh, stdin=subprocess.DEVNULL, env=env, cwd=NEUTRAL_CWD
        )
    deadline = t0 + 60
    while not ready():
        if proc.poll() is not None or time.perf_counter() > deadline:
            proc.kill()
            proc.wait()
            raise SystemExit(f"{argv[0]} did not get ready: see {log}\n{log.read_text()[-2000:]}")
        time.sleep(0.001)
    ready_s = time.perf_counter() - t0
    return Started(proc, ready_s, cpu_s(proc.pid))


# ---------------------------------------------------------------- the gateway


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def gateway_config(
    work: Path,
    port: int,
    *,
    bucket: dict[str, object] | None = None,
    server: str | None = None,
    topics: Sequence[tuple[str, str]] = (("telemetry", "north"),),
) -> Path:
    """The default config (what ``edgegw init`` writes, comments aside) with a chosen port."""
    api: dict[str, object] = {"listen": f"127.0.0.1:{port}"}
    if server:
        api["server"] = server
    sections: dict[str, dict[str, object]] = {"api": api, "bucket": bucket or {"type": "local"}}
    lines = ['region = "north"', f"data_dir = {_toml(work / 'data')}"]
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml(v)}" for k, v in values.items()]
    for name, home in topics:
        subscribers = ["*"] if home != "north" or len(topics) > 1 else []
        lines += [
            "[[topics]]",
            f"name = {_toml(name)}",
            f"home = {_toml(home)}",
            "partitions = 4",
            f"subscribers = {_toml(subscribers)}",
        ]
    path = work / "edgegw.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_gateway(work: Path, idle_s: float, **config: object) -> tuple[float, float, float, float]:
    """One start on a fresh data directory: (ready s, ready CPU s, idle RSS MB
    after a scrape of /metrics, idle RSS MB before it)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    port = free_port()
    cfg = gateway_config(work, port, **config)  # type: ignore[arg-type]
    g = start(
        edgegw_argv("serve", "--config", str(cfg)),
        lambda: http_200(port),
        work / "log",
        child_env(),
    )
    try:
        # Idle, then scraped once (a gateway in production is scraped: the
        # exposition loads prometheus_client at the first scrape), then idle.
        unscraped = g.idle_rss_mb(idle_s)
        if not http_200(port, "/metrics"):
            raise SystemExit(f"GET /metrics failed: see {work / 'log'}")
        return g.ready_s, g.ready_cpu_s, g.idle_rss_mb(idle_s / 2), unscraped
    finally:
        g.stop()


def gateway_starts(work: Path, runs: int, idle_s: float, **config: object) -> dict[str, float]:
    ready, cpu, rss, unscraped = [], [], [], []
    for _ in range(runs):
        r, c, m, u = run_gateway(work, idle_s, **config)
        ready.append(r)
        cpu.append(c)
        rss.append(m)
        unscraped.append(u)
    return {
        "ready_min": min(ready),
        "ready_median": median(ready),
        "cpu_min": min(cpu),
        "rss": median(rss),
        "rss_unscraped": median(unscraped),
    }


# ------------------------------------------------------------------ baselines


def python_floor(runs: int) -> tuple[float, float, float]:
    """``python -c pass``: min and median wall seconds; RSS of such a process (MB)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, cwd=NEUTRAL_CWD)
        times.append(time.perf_counter() - t0)
    return min(times), median(times), import_rss([])


def import_rss(modules: Sequence[str]) -> float:
    code = "".join(f"import {m}\n" for m in modules)
    code += "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])\n"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=NEUTRAL_CWD,
    )
    return int(out.stdout.strip()) / 1024


def import_cost(modules: Sequence[str], runs: int) -> tuple[float, float]:
    """(min wall seconds, RSS MB) of ``python -c "import M1; import M2 ..."``."""
    code = "".join(f"import {m}\n" for m in modules) or "pass"
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=child_env(), cwd=NEUTRAL_CWD)
        times.append(time.perf_counter() - t0)
    return min(times), import_rss(modules)


def _in_source(module: str) -> bool:
    """False for an edgegw module the measured checkout does not have (an older one)."""
    top, _, rest = module.partition(".")
    if top not in ("edge_gateway", "edgegw_cli"):
        return True
    base = source() / ("cli" if top == "edgegw_cli" else "") / top / rest.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def import_chain(runs: int) -> list[tuple[str, float, float]]:
    """(step, seconds, MB) that each step of :data:`LOADED` adds to the one before."""
    out = []
    modules: list[str] = []
    before = import_cost([], runs)
    for name, step in LOADED:
        modules += [m for m in step if _in_source(m)]
        now = import_cost(modules, runs)
        out.append((name, now[0] - before[0], now[1] - before[1]))
        before = now
    return out


def help_time(runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(
            edgegw_argv("--help"),
            check=True,
            stdout=subprocess.DEVNULL,
            env=child_env(),
            cwd=NEUTRAL_CWD,
        )
        times.append(time.perf_counter() - t0)
    return min(times), median(times)


def nats_baseline(work: Path, runs: int, idle_s: float) -> dict[str, float] | str:
    exe = shutil.which("nats-server")
    if exe is None:
        return "nats-server not installed (apt-get install nats-server)"
    ready, rss = [], []
    for i in range(runs):
        port, mon = free_port(), free_port()
        store = work / f"nats-{i}"
        argv = [exe, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port), "-m", str(mon)]
        s = start(argv, lambda mon=mon: http_200(mon), work / "nats.log")  # type: ignore[misc]
        try:
            ready.append(s.ready_s)
            rss.append(s.idle_rss_mb(idle_s))
        finally:
            s.stop()
    return {"ready_min": min(ready), "ready_median": median(ready), "rss": median(rss)}


def mosquitto_baseline(work: Path, runs: int, idle_s: float) -> dict[str, float] | str:
    exe = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if exe is None:
        return "mosquitto not installed (apt-get install mosquitto)"
    ready, rss = [], []
    for i in range(runs):
        port = free_port()
        conf = work / f"mosquitto-{i}.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
        s = start([exe, "-c", str(conf)], lambda port=port: mqtt_ready(port), work / "mosq.log")  # type: ignore[misc]
        try:
            ready.append(s.ready_s)
            rss.append(s.idle_rss_mb(idle_s))
        finally:
            s.stop()
    return {"ready_min": min(ready), "ready_median": median(ready), "rss": median(rss)}


def s3_gateway(work: Path, runs: int, idle_s: float) -> dict[str, float] | str:
    try:
        import boto3

        from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY, start_moto_server
    except ImportError as exc:
        return f"no moto/boto3 here: {exc}"
    work.mkdir(parents=True, exist_ok=True)
    server = start_moto_server(work / "moto.log")
    try:
        client = boto3.client(
            "s3",
            endpoint_url=server.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )
        client.create_bucket(Bucket="edgegw-footprint")
        bucket: dict[str, object] = {
            "type": "s3",
            "bucket": "edgegw-footprint",
            "endpoint_url": server.endpoint,
            "region": REGION,
            "path_style": True,
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
        }
        results = []
        for i in range(runs):
            # Each start its own prefix: a fresh region log, as for the local runs.
            results.append(run_gateway(work / "gw", idle_s, bucket={**bucket, "prefix": f"run{i}"}))
        return {
            "ready_min": min(r[0] for r in results),
            "ready_median": median([r[0] for r in results]),
            "rss": median([r[2] for r in results]),
        }
    finally:
        server.stop()


# ----------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs, shorter idle (~1 min)")
    ap.add_argument("--runs", type=int, help="gateway starts per figure (default 10, quick 5)")
    ap.add_argument(
        "--source",
        type=Path,
        help="measure the code of another checkout (e.g. an export of an older commit)",
    )
    args = ap.parse_args()
    if args.source:
        os.environ["FOOTPRINT_BENCH_SOURCE"] = str(args.source.resolve())
    runs = args.runs or (5 if args.quick else 10)
    idle_s = 1.0 if args.quick else 3.0

    progress("byte-compiling edge_gateway and edgegw_cli (as pip install does)")
    compileall.compile_dir(source() / "edge_gateway", quiet=1)
    compileall.compile_dir(source() / "cli", quiet=1)

    with scratch_dir("footprint-") as work:
        progress("interpreter floor")
        floor_min, floor_med, floor_rss = python_floor(runs * 2)
        # One start not counted: warms the page cache (and writes byte-code left out above).
        run_gateway(work / "warm", 0.1)
        progress(f"edgegw serve, default config, {runs} starts")
        default = gateway_starts(work / "gw", runs, idle_s)
        progress(f"edgegw serve, api.server = builtin, {runs} starts")
        builtin = gateway_starts(work / "gw", runs, idle_s, server="builtin")
        progress("edgegw serve with 100 topics x 4 partitions and 2 mirrored regions")
        homes = ("north", "south", "east")
        topics = [(f"{home}{i:03d}", home) for home in homes for i in range(100)]
        many = gateway_starts(work / "gw", max(2, runs // 3), idle_s, topics=topics)
        progress("edgegw serve with an S3 bucket (moto)")
        s3 = s3_gateway(work / "s3", max(2, runs // 3), idle_s)
        progress("edgegw --help")
        help_min, help_med = help_time(runs)
        progress("imports")
        chain = import_chain(7 if args.quick else 11)
        imports = {m: import_cost([m], 3) for m in NOT_LOADED}
        progress("nats-server, mosquitto")
        nats = nats_baseline(work, max(2, runs // 2), idle_s)
        mosq = mosquitto_baseline(work, max(2, runs // 2), idle_s)

    floor = ("python -c pass", floor_min)
    floor_rss_b = ("python -c pass", floor_rss)
    per_topic_kb = (many["rss"] - default["rss"]) * 1024 / len(topics)
    rows: list[Row | str] = [
        f"edgegw serve, default config (local bucket, hypercorn), {runs} starts",
        Row(
            "start to ready, min",
            default["ready_min"],
            "s",
            *floor,
            f"<= {READY_TARGET_S}",
            default["ready_min"] <= READY_TARGET_S,
        ),
        Row(
            "start to ready, median",
            default["ready_median"],
            "s",
            "python -c pass, median",
            floor_med,
        ),
        Row("CPU until ready, min", default["cpu_min"], "s"),
        Row(
            "idle RSS",
            default["rss"],
            "MB",
            *floor_rss_b,
            f"<= {IDLE_RSS_TARGET_MB:g}",
            default["rss"] <= IDLE_RSS_TARGET_MB,
        ),
        Row("idle RSS, never scraped", default["rss_unscraped"], "MB", *floor_rss_b),
        'api.server = "builtin"',
        Row(
            "start to ready, min",
            builtin["ready_min"],
            "s",
            *floor,
            f"<= {READY_TARGET_S}",
            builtin["ready_min"] <= READY_TARGET_S,
        ),
        Row(
            "start to ready, median",
            builtin["ready_median"],
            "s",
            "python -c pass, median",
            floor_med,
        ),
        Row("CPU until ready, min", builtin["cpu_min"], "s"),
        Row(
            "idle RSS",
            builtin["rss"],
            "MB",
            *floor_rss_b,
            f"<= {IDLE_RSS_TARGET_MB:g}",
            builtin["rss"] <= IDLE_RSS_TARGET_MB,
        ),
        Row("idle RSS, never scraped", builtin["rss_unscraped"], "MB", *floor_rss_b),
        f"{len(topics)} topics x 4 partitions (100 local, 2 mirrored regions x 100), idle",
        Row("idle RSS", many["rss"], "MB", "1 topic", default["rss"]),
        Row("growth per topic", per_topic_kb, "KiB"),
        Row("start to ready, min", many["ready_min"], "s", "1 topic", default["ready_min"]),
    ]
    if isinstance(s3, dict):
        rows += [
            "S3 bucket (moto), default API server",
            Row("idle RSS", s3["rss"], "MB", "local bucket", default["rss"]),
            Row("start to ready, min", s3["ready_min"], "s", "local bucket", default["ready_min"]),
        ]
    else:
        rows.append(f"S3 bucket: skipped: {s3}")
    rows += [
        "the command line",
        Row("edgegw --help, min", help_min, "s", *floor),
        Row("edgegw --help, median", help_med, "s", "python -c pass, median", floor_med),
        "what a local-bucket gateway loads, step by step (python -c 'import ...')",
    ]
    interpreter = "the interpreter (python -c pass)"
    rows.append(f"  {interpreter:<34} {floor_min * 1000:6.0f} ms  {floor_rss:5.1f} MB")
    for step, seconds, mb in chain:
        rows.append(f"  + {step:<32} {seconds * 1000:+6.0f} ms  {mb:+5.1f} MB")
    rows.append("what it no longer loads, each alone, less the floor")
    for module, (seconds, mb) in imports.items():
        ms, extra_mb = (seconds - floor_min) * 1000, mb - floor_rss
        rows.append(f"  {module:<34} {ms:+6.0f} ms  {extra_mb:+5.1f} MB")
    for name, figures in (("nats-server -js", nats), ("mosquitto", mosq)):
        if isinstance(figures, str):
            rows.append(f"{name}: skipped: {figures}")
            continue
        rows += [
            name,
            Row(
                "start to ready, min",
                figures["ready_min"],
                "s",
                "edgegw (builtin)",
                builtin["ready_min"],
            ),
            Row("idle RSS", figures["rss"], "MB", "edgegw (builtin)", builtin["rss"]),
        ]
    print(render_table("edgegw footprint", rows))
    print(
        "\nnote: ratios are value / baseline; start to ready is exec to the first "
        "/healthz 200 (MQTT CONNACK for mosquitto); wall times suffer from other load "
        "on the machine, CPU until ready less so."
    )
    emit_json(
        {
            "ready_s": default["ready_min"],
            "ready_median_s": default["ready_median"],
            "ready_cpu_s": default["cpu_min"],
            "idle_rss_mb": default["rss"],
            "idle_rss_unscraped_mb": default["rss_unscraped"],
            "builtin_ready_s": builtin["ready_min"],
            "builtin_ready_cpu_s": builtin["cpu_min"],
            "builtin_idle_rss_mb": builtin["rss"],
            "builtin_idle_rss_unscraped_mb": builtin["rss_unscraped"],
            "rss_100_topics_mb": many["rss"],
            "topics_at_gateway": len(topics),
            "rss_per_topic_kb": per_topic_kb,
            "s3_idle_rss_mb": s3["rss"] if isinstance(s3, dict) else None,
            "help_s": help_min,
            "python_floor_s": floor_min,
            "python_floor_rss_mb": floor_rss,
            "loaded_steps": {step: {"s": s, "rss_mb": mb} for step, s, mb in chain},
            "not_loaded": {
                m: {"s": t - floor_min, "rss_mb": r - floor_rss} for m, (t, r) in imports.items()
            },
            "nats_ready_s": nats["ready_min"] if isinstance(nats, dict) else None,
            "nats_idle_rss_mb": nats["rss"] if isinstance(nats, dict) else None,
            "mosquitto_ready_s": mosq["ready_min"] if isinstance(mosq, dict) else None,
            "mosquitto_idle_rss_mb": mosq["rss"] if isinstance(mosq, dict) else None,
            "runs": runs,
        }
    )


if __name__ == "__main__":
    main()
