"""A live twin in a process of its own (``hetsched twin SOC --root DIR``), for CLI tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def twin_process(soc: str, root: Path, ready: str) -> Iterator[Path]:
    """Start the twin on ``root``, wait for ``ready`` (a root-relative file) and one full
    update, yield ``root``; stop the twin with SIGTERM afterwards."""
    twin = subprocess.Popen([sys.executable, "-m", "hetsched", "twin", soc, "--root", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not (root / ready).exists():
            if time.monotonic() > deadline or twin.poll() is not None:
                raise AssertionError("the twin did not start")
            time.sleep(0.05)
        time.sleep(0.3)  # one full update, so every file is written
        yield root
    finally:
        twin.send_signal(signal.SIGTERM)
        twin.wait(timeout=30)
