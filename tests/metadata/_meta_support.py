"""A real `edgegw metadata serve` process for tests (its URL comes from --addr-file)."""

from __future__ import annotations

import hashlib
import itertools
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from _serve import Gateway

from edge_gateway.testing.postgres import Postgres

EDGEGW = Path(sys.executable).parent / "edgegw"
ADMIN_TOKEN = "admin-token-for-tests-0123456789"


_databases = itertools.count()


def scrypt_hash(token: str) -> str:
    """A token hash as servers before SHA-256 hashes wrote it (salted scrypt), for upgrade tests."""
    salt = secrets.token_bytes(16)
    n, r, p = 1 << 14, 8, 1
    digest = hashlib.scrypt(token.encode(), salt=salt, n=n, r=r, p=p)
    return f"scrypt${n}${r}${p}${salt.hex()}${digest.hex()}"


def new_database(pg: Postgres) -> str:
    """The URL of a new, empty database on ``pg``."""
    return pg.create_database(f"meta{next(_databases)}")


class MetaServer:
    """``edgegw metadata serve`` on port 0; ``url`` once it listens."""

    def __init__(
        self,
        db: Path | str,
        *,
        admin_token: str | None = ADMIN_TOKEN,
        listen: str = "127.0.0.1:0",
        extra: tuple[str, ...] = (),
        files: Path | None = None,
    ) -> None:
        """``db``: a SQLite file or a ``postgresql://`` URL (then its address
        and log files are ``files``.addr and ``files``.log)."""
        self.db = db
        base = Path(db) if files is None else files
        self.addr_file = base.with_suffix(".addr")
        self.addr_file.unlink(missing_ok=True)
        self.log = base.with_suffix(".log")
        argv = [str(EDGEGW), "metadata", "serve", "--db", str(db), "--listen", listen]
        argv += ["--addr-file", str(self.addr_file), *extra]
        if admin_token is not None:
            argv += ["--admin-token", admin_token]
        # Output to a file, not a pipe: a chatty server must never block on a full pipe.
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not self.addr_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait(timeout=30)
                raise AssertionError(f"metadata serve did not start: {self.log.read_text()}")
            time.sleep(0.02)
        self.url = self.addr_file.read_text().strip()

    def kill(self) -> None:
        """kill -9: no graceful stop, the address file stays."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)


@dataclass
class Fleet:
    """A running server with regions (the ``fleet`` fixture)."""

    server: MetaServer
    url: str
    #: region -> its token
    tokens: dict[str, str]


def http(url: str, token: str | None = ADMIN_TOKEN) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def admin(url: str, method: str, path: str, body: object = None) -> Any:
    """One admin request that must succeed; its JSON answer (None when empty)."""
    with http(url) as c:
        r = c.request(method, path, json=body)
        assert r.status_code < 300, r.text
        return r.json() if r.content else None


def lanes(g: Gateway) -> dict[str, dict[str, Any]]:
    """A gateway's lanes in its status, by name."""
    return {lane["lane"]: lane for lane in g.status()["lanes"]["lanes"]}


def produce_two_partitions(g: Gateway, topic: str, n: int) -> None:
    """``n`` records ``<topic>-<p>-<i>`` into each of partitions 0 and 1."""
    with g.client() as c:
        for p in range(2):
            c.produce(topic, [f"{topic}-{p}-{i}" for i in range(n)], partition=p)
