"""A throwaway PostgreSQL cluster (Debian's ``postgresql`` package), for tests and benchmarks.

:class:`Postgres` runs ``initdb`` into a directory and ``pg_ctl start`` on a
free loopback port, its socket in the same directory; trust authentication
on loopback only. ``initdb`` refuses to run as root, so as root the cluster
belongs to user ``postgres`` (``runuser``). ``make postgresql`` installs the
binaries; :data:`BIN_DIR` is None when they are absent (tests skip, saying so).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path

from edge_gateway.testing.ports import free_port

__all__ = ["BIN_DIR", "Postgres"]


def _bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return Path(versions[0]).parent if versions else None


BIN_DIR: Path | None = _bin_dir()


class Postgres:
    """One cluster; :meth:`restart` keeps its port and data."""

    def __init__(self, root: Path) -> None:
        if BIN_DIR is None:
            raise RuntimeError("PostgreSQL is not installed (make postgresql)")
        self.root = root
        self.data = root / "pgdata"
        self.data.mkdir(parents=True)
        self.port = free_port()
        self.log = root / "postgres.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(root, "postgres")
            shutil.chown(self.data, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as conf:
            # Loopback and our own socket directory only; fsync off: a test cluster.
            conf.write(
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.data}'\n"
                "fsync = off\nfull_page_writes = off\nsynchronous_commit = off\n"
                "max_connections = 200\n"
            )
        self.start()

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert BIN_DIR is not None
        argv = [str(BIN_DIR / tool), *args]
        if self._as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        result = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=120, cwd="/"
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{tool} failed: {result.stdout}{result.stderr}")
        return result

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        if self._as_root:
            self.log.touch()
            shutil.chown(self.log, "postgres")
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", f"-p {self.port}", "-w",
            "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", f"-p {self.port}",
            "-m", "fast", "-w", "restart",
        )  # fmt: skip

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        result = self._run(
            "psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", dbname,
            "-tA", "-v", "ON_ERROR_STOP=1", "-c", sql,
        )  # fmt: skip
        return result.stdout

    def wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        ready = ("pg_isready", "-h", "127.0.0.1", "-p", str(self.port))
        while self._run(*ready, check=False).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError("PostgreSQL is not ready")
            time.sleep(0.1)
