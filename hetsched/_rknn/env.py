"""The RKNN toolkit's own Python environment: where it is and how ``hetsched setup rknn`` makes it.

rknn-toolkit2 pins numpy <= 1.26.4, onnx <= 1.18, protobuf <= 4.25.4 and torch <= 2.4 and needs
``pkg_resources`` (setuptools < 81), so it cannot share hetsched's environment. It gets a venv
of its own, and the worker process (``client``) runs with that venv's Python. The requirement
list is the toolkit's own (its wheel metadata, https://pypi.org/project/rknn-toolkit2/2.5.0/),
installed first; the toolkit itself then goes in with ``--no-deps`` so that ``--torch`` can
name a torch outside the toolkit's pin (torch is imported at import time, but ONNX conversion
and the simulator do not depend on its version).

Setup holds an exclusive ``flock`` on ``setup.lock`` inside the environment's folder for its whole
run: a second setup of the same folder waits (and says so), then finds the environment ready. The
ready marker (``hetsched-setup.json``) is written last, atomically; a folder without it (a setup
that was interrupted or failed) is never used, and the next setup empties it and builds it again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    "toolkit_unavailable_reason",
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
LOCK_NAME = "setup.lock"
_MARKER = "hetsched-setup.json"
"""Written last by a setup that succeeded: an environment without it is incomplete."""
_TIMES = "hetsched-setup-times.json"
"""Each step's duration in the last setup that succeeded: the next setup's estimates."""
_KEEP = frozenset({LOG_NAME, LOCK_NAME, _TIMES})
"""What emptying an incomplete environment leaves in its folder."""

STEP_ESTIMATES_S = (5.0, 50.0, 5.0, 5.0)
"""Expected seconds of each setup step before any setup has succeeded in the folder (measured on a
2-core x86-64 host with a warm pip cache: 4.1, 46.8, 1.8 and 2.4 s, 56 s in all; with a cold
cache the dependency step downloads about 300 MB and takes minutes)."""

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
    """One step's start (``seconds`` None) or end, as ``setup_toolkit_env`` reports it; or, with
    ``status == "waiting"`` (index 0), that another setup holds the folder and this one waits."""

    index: int
    total: int
    step: str
    status: str
    """``"waiting"``, ``"start"``, ``"done"`` or ``"skipped"``."""
    seconds: float | None = None
    expected_s: float | None = None
    """At ``"start"``: how long this step is expected to take (the last successful setup's figure,
    else :data:`STEP_ESTIMATES_S`)."""
    remaining_s: float | None = None
    """At ``"start"``: the expected seconds of this step and every later one that will run."""
    holder: int | None = None
    """At ``"waiting"``: the process id of the setup that holds the folder, when it wrote one."""


def toolkit_unavailable_reason() -> str | None:
    """Why stages cannot compile for the NPU off the board (no RKNN toolkit environment), or None.

    The device resolver asks this to leave the NPU out of a twin root's default devices
    rather than plan stages onto it that would then fail to compile.
    """
    try:
        find_toolkit_python()
    except BackendUnavailableError as exc:
        return str(exc)
    return None


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


@contextmanager
def _setup_lock(env_dir: Path, progress: Callable[[SetupProgress], None] | None, total: int) -> Iterator[None]:
    """Hold an exclusive lock on ``env_dir`` (``flock`` on its ``setup.lock``); waits for another holder,
    reporting ``"waiting"`` once. The lock goes with the process, however it ends."""
    fd = os.open(env_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            if progress is not None:
                text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                holder = int(text) if text.isdigit() else None
                progress(SetupProgress(0, total, f"another setup holds {env_dir}", "waiting", holder=holder))
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` or what it held before, never a part: a temporary file renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _empty_incomplete(env_dir: Path) -> None:
    """Remove what an interrupted or failed setup left in ``env_dir`` (its log, lock and timings stay).

    :raises BackendUnavailableError: the folder holds files but is no environment of ours (no
        ``pyvenv.cfg``, no setup log): nothing in it is deleted.
    """
    entries = list(os.scandir(env_dir))
    names = {e.name for e in entries}
    if not names - _KEEP:
        return
    if not names & {"pyvenv.cfg", LOG_NAME}:
        raise BackendUnavailableError(f"RKNN toolkit setup: {env_dir} holds files but no environment "
                                      f"(no pyvenv.cfg); give an empty or new folder with --dir")
    for e in entries:
        if e.name in _KEEP:
            continue
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path)
        else:
            os.unlink(e.path)  # files and links (a venv's lib64): the link, never its target


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
    steps = setup_steps(env_dir, torch=torch, python=python)
    with _setup_lock(env_dir, progress, len(steps)):
        return _setup_locked(env_dir, steps, torch, progress)


def _setup_locked(env_dir: Path, steps: list[SetupStep], torch: str,
                  progress: Callable[[SetupProgress], None] | None) -> Path:
    log = env_dir / LOG_NAME
    marker = env_dir / _MARKER
    wanted = {"toolkit": TOOLKIT_VERSION, "torch": torch}
    found = _read_json(marker)
    complete = isinstance(found, dict) and _env_python(env_dir).exists()
    done = complete and found == wanted
    if not complete:
        _empty_incomplete(env_dir)  # never build on top of a half environment
    if not done:
        marker.unlink(missing_ok=True)  # from here until the end the folder is incomplete
    times = _read_json(env_dir / _TIMES)
    last = {k: float(v) for k, v in times.items() if isinstance(v, (int, float)) and v >= 0} if isinstance(
        times, dict) else {}
    estimates = [*STEP_ESTIMATES_S, *[STEP_ESTIMATES_S[-1]] * max(0, len(steps) - len(STEP_ESTIMATES_S))]
    expected = [last.get(step.name, est) for step, est in zip(steps, estimates, strict=False)]
    skips = [(k == 1 and _env_python(env_dir).exists()) or (done and k < len(steps)) for k in range(1, len(steps) + 1)]
    took: dict[str, float] = {}
    for index, step in enumerate(steps, 1):
        if skips[index - 1]:
            if progress is not None:
                progress(SetupProgress(index, len(steps), step.name, "skipped", 0.0))
            continue
        if progress is not None:
            left = sum(e for e, skip in zip(expected[index - 1:], skips[index - 1:], strict=True) if not skip)
            progress(SetupProgress(index, len(steps), step.name, "start", expected_s=expected[index - 1],
                                   remaining_s=left))
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
                marker.unlink(missing_ok=True)
                raise BackendUnavailableError(f"RKNN toolkit setup: {step.name} could not run {step.argv[0]}: {exc}") from exc
        if code != 0:
            marker.unlink(missing_ok=True)  # a failed check: the environment is not ready after all
            raise BackendUnavailableError(
                f"RKNN toolkit setup failed at step {index}/{len(steps)} ({step.name}, exit status {code}); "
                f"log: {log}\n{_tail(log, start)}"
            )
        took[step.name] = time.monotonic() - t0
        if progress is not None:
            progress(SetupProgress(index, len(steps), step.name, "done", took[step.name]))
    if not done:  # a full run: its figures are the next run's estimates
        _write_atomically(env_dir / _TIMES, json.dumps({**last, **took}))
    if found != wanted or not marker.is_file():
        _write_atomically(marker, json.dumps(wanted))  # last: only now is the environment ready
    return env_dir
