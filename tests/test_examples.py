"""The examples run as a user would run them, and say what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

EXPECTED = {
    "quickstart.py": "streamed 32 requests",
    "custom_policy.py": "every stage avoided the hot core",
    "twin_board.py": "rails:",
    "governor_sim.py": "reloaded: 0 tuning runs",
    "custom_board.py": "every clock restored (8 knobs as before)",
    "several_models.py": "background loops spread over the GPU and dla:0, dla:1",
}


def test_every_example_is_covered() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert EXPECTED[name] in proc.stdout
