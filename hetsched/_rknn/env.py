"""The RKNN toolkit's own Python environment: where it is and how ``hetsched setup rknn`` makes it.

rknn-toolkit2 pins numpy <= 1.26.4, onnx <= 1.18, protobuf <= 4.25.4 and torch <= 2.4 and needs
``pkg_resources`` (setuptools < 81), so it cannot share hetsched's environment. It gets a venv
of its own, and the worker process (``client``) runs with that venv's Python. The requirement
list is the toolkit's own (its wheel metadata, https://pypi.org/project/rknn-toolkit2/2.5.0/),
installed first; the toolkit itself then goes in with ``--no-deps`` so that ``--torch`` can
name a torch outside the toolkit's pin (torch is imported at import time, but ONNX conversion
and the simulator do not depend on its version).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._errors import BackendUnavailableError

__all__ = [
    "DEFAULT_TORCH",
    "TOOLKIT_VERSION",
    "SetupProgress",
    "SetupStep",
    "find_toolkit_python",
    "setup_steps",
    "setup_toolkit_env",
    "toolkit_env_dir",
]

TOOLKIT_VERSION = "2.5.0"
DEFAULT_TORCH = "torch>=1.10.1,<=2.4.0"
"""The toolkit's own torch pin; ``hetsched setup rknn --torch SPEC`` overrides it."""

REQUIREMENTS = (
    "setuptools>=77,<81",
    "numpy<=1.26.4",
    "onnx>=1.16.1,<=1.18.0",
    "onnxruntime>=1.17.0,<1.20",
    "protobuf>=4.21.6,<=4.25.4",
    "psutil",
    "ruamel.yaml>=0.17.21",
    "scipy>=1.9.3",
    "tqdm>=4.64.1",
    "opencv-python-headless>=4.5.5.64",
    "fast-histogram>=0.11",
)

ENV_VARIABLE = "HETSCHED_RKNN_PYTHON"
LOG_NAME = "setup.log"
_MARKER = "hetsched-setup.json"
"""Written last by a setup that succeeded: an environment without it is incomplete."""

_SETUP_HINT = f"run `hetsched setup rknn` (or set {ENV_VARIABLE} to the toolkit environment's python)"


def toolkit_env_dir() -> Path:
    """Where ``hetsched setup rknn`` puts the environment: ``$XDG_CACHE_HOME/hetsched/rknn-toolkit2-<version>``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache, "hetsched", f"rknn-toolkit2-{TOOLKIT_VERSION}")


def _env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def find_toolkit_python() -> str:
    """The interpreter of the RKNN toolkit's environment.

    ``$HETSCHED_RKNN_PYTHON`` when set, else the environment made by ``hetsched setup rknn``
    under :func:`toolkit_env_dir`.

    :raises BackendUnavailableError: the variable names no executable file, or no complete
        environment exists; the message says to run ``hetsched setup rknn``.
    """
    named = os.environ.get(ENV_VARIABLE)
    if named:
        if os.path.isfile(named) and os.access(named, os.X_OK):
            return named
        raise BackendUnavailableError(f"{ENV_VARIABLE}={named} is not an executable file: {_SETUP_HINT}")
    env_dir = toolkit_env_dir()
    python = _env_python(env_dir)
    if not (python.exists() and os.access(python, os.X_OK)):
        raise BackendUnavailableError(f"RKNN toolkit environment not found at {env_dir}: {_SETUP_HINT}")
    if not (env_dir / _MARKER).is_file():
        raise BackendUnavailableError(f"RKNN toolkit environment at {env_dir} is incomplete: {_SETUP_HINT}")
    return str(python)


# -- setup ------------------------------------------------------------------------


@dataclass(frozen=True)
class SetupStep:
    name: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class SetupProgress:
    """One step's start (``seconds`` None) or end, as ``setup_toolkit_env`` reports it."""

    index: int
    total: int
    step: str
    status: str
    """``"start"``, ``"done"`` or ``"skipped"``."""
    seconds: float | None = None


def setup_steps(env_dir: Path, *, torch: str, python: str) -> list[SetupStep]:
    """The commands that make the environment at ``env_dir``, in order (pure; nothing runs)."""
    env_python = str(_env_python(env_dir))
    pip = (env_python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input")
    check = (
        "import importlib.metadata as m, rknn.api; "
        f"v = m.version('rknn-toolkit2'); assert v == {TOOLKIT_VERSION!r}, v; print('rknn-toolkit2', v)"
    )
    return [
        SetupStep("create the virtual environment", (python, "-m", "venv", str(env_dir))),
        SetupStep("install the toolkit's dependencies", (*pip, *REQUIREMENTS, torch)),
        SetupStep(f"install rknn-toolkit2 {TOOLKIT_VERSION}", (*pip, "--no-deps", f"rknn-toolkit2=={TOOLKIT_VERSION}")),
        SetupStep("check that the toolkit imports", (env_python, "-c", check)),
    ]


def _tail(log: Path, start: int, lines: int = 12) -> str:
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", "replace")
    return "\n".join(text.strip().splitlines()[-lines:])


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def setup_toolkit_env(
    *,
    torch: str = DEFAULT_TORCH,
    python: str = sys.executable,
    directory: str | os.PathLike[str] | None = None,
    progress: Callable[[SetupProgress], None] | None = None,
) -> Path:
    """Create or update the toolkit environment; returns its directory.

    Idempotent: when a previous setup of the same toolkit version and torch spec completed,
    only the import check runs. The output of every command is appended to ``setup.log`` in
    the environment's directory.

    :param torch: the torch requirement (default: the toolkit's own pin).
    :param python: the interpreter the venv is made from (3.8 to 3.12, the toolkit's wheels).
    :param directory: where (default :func:`toolkit_env_dir`).
    :param progress: called at the start and end of every step.
    :raises BackendUnavailableError: a step failed; the message names the step, the log file
        and the last lines of the command's output.
    """
    env_dir = Path(directory) if directory is not None else toolkit_env_dir()
    env_dir.mkdir(parents=True, exist_ok=True)
    log = env_dir / LOG_NAME
    marker = env_dir / _MARKER
    wanted = {"toolkit": TOOLKIT_VERSION, "torch": torch}
    try:
        done = json.loads(marker.read_text()) == wanted and _env_python(env_dir).exists()
    except (OSError, ValueError):
        done = False
    steps = setup_steps(env_dir, torch=torch, python=python)
    marker.unlink(missing_ok=True)
    for index, step in enumerate(steps, 1):
        skip = (index == 1 and _env_python(env_dir).exists()) or (done and index < len(steps))
        if skip:
            if progress is not None:
                progress(SetupProgress(index, len(steps), step.name, "skipped", 0.0))
            continue
        if progress is not None:
            progress(SetupProgress(index, len(steps), step.name, "start"))
        t0 = time.monotonic()
        with open(log, "ab") as out:
            start = out.tell()
            out.write(f"\n$ {' '.join(step.argv)}\n".encode())
            out.flush()
            try:
                code = subprocess.run(
                    step.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=_child_env(), check=False,
                ).returncode
            except OSError as exc:
                raise BackendUnavailableError(f"RKNN toolkit setup: {step.name} could not run {step.argv[0]}: {exc}") from exc
        if code != 0:
            raise BackendUnavailableError(
                f"RKNN toolkit setup failed at step {index}/{len(steps)} ({step.name}, exit status {code}); "
                f"log: {log}\n{_tail(log, start)}"
            )
        if progress is not None:
            progress(SetupProgress(index, len(steps), step.name, "done", time.monotonic() - t0))
    marker.write_text(json.dumps(wanted))
    return env_dir
