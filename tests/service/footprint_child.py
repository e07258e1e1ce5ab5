"""Run ``edgegw serve ARGS`` in this process, as the console script does
(:func:`edgegw_cli.app.main`); once the gateway is ready (its ``api.addr``
file exists), print the names of every module it imported as one JSON line
on stdout and stop it with SIGTERM (a graceful stop: exit code 0).

Usage: python footprint_child.py DATA_DIR serve --config CONFIG
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


def _dump_when_ready(addr_file: Path) -> None:
    deadline = time.monotonic() + 60
    while not addr_file.exists():
        if time.monotonic() > deadline:
            os._exit(97)
        time.sleep(0.01)
    print(json.dumps(sorted(sys.modules)), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    addr_file = Path(sys.argv[1]) / "api.addr"
    sys.argv = ["edgegw", *sys.argv[2:]]
    threading.Thread(target=_dump_when_ready, args=(addr_file,), daemon=True).start()
    from edgegw_cli.app import main as edgegw

    edgegw()


if __name__ == "__main__":
    main()
