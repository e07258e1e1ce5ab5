"""A child process for crash tests, its stdout drained by a thread.

Draining in a thread matters: a child blocked on a full stdout pipe would
stall its event loop (and with it the shipper or tailer under test).
Subclasses parse each line in :meth:`on_line`.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time


class ChildProcess:
    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def on_line(self, line: str) -> None:
        """Called (in the drain thread, under a lock) for every line the child prints."""

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line)
                self.on_line(line)

    def wait_for_output(self, timeout: float = 30) -> None:
        """Wait until the child printed a line (or exited, or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        while not self.lines and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self, sig: int = signal.SIGKILL) -> str:
        """Signal the child (kill -9 by default), reap it; returns its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self._thread.join(timeout=30)
        err = self.proc.stderr.read() if self.proc.stderr else ""
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()
        return err
