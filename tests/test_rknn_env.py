"""Finding and making the RKNN toolkit's environment (hetsched._rknn.env, ``hetsched setup rknn``).

No pip runs here: setup is driven with a fake interpreter whose "venv" is a shell script that
records its arguments and succeeds or fails on demand.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetsched import BackendUnavailableError
from hetsched._cli import main
from hetsched._rknn import env
from hetsched._rknn.env import (
    DEFAULT_TORCH,
    REQUIREMENTS,
    TOOLKIT_VERSION,
    SetupProgress,
    find_toolkit_python,
    setup_steps,
    setup_toolkit_env,
    toolkit_env_dir,
)


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("HETSCHED_RKNN_PYTHON", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_variable_is_honoured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    python = _executable(tmp_path / "bin" / "python", "#!/bin/sh\n")
    monkeypatch.setenv("HETSCHED_RKNN_PYTHON", str(python))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    assert find_toolkit_python() == str(python)


def test_variable_naming_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HETSCHED_RKNN_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(BackendUnavailableError, match=r"HETSCHED_RKNN_PYTHON=.*missing.*`hetsched setup rknn`"):
        find_toolkit_python()


def test_missing_environment_names_setup(no_env: Path) -> None:
    assert toolkit_env_dir() == no_env / "hetsched" / f"rknn-toolkit2-{TOOLKIT_VERSION}"
    with pytest.raises(BackendUnavailableError, match="`hetsched setup rknn`") as info:
        find_toolkit_python()
    assert str(toolkit_env_dir()) in str(info.value)
    assert isinstance(info.value, ImportError)


def test_default_dir_without_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert toolkit_env_dir() == tmp_path / ".cache" / "hetsched" / f"rknn-toolkit2-{TOOLKIT_VERSION}"


def test_incomplete_environment_is_not_used(no_env: Path) -> None:
    python = _executable(toolkit_env_dir() / "bin" / "python", "#!/bin/sh\n")
    with pytest.raises(BackendUnavailableError, match=r"incomplete.*`hetsched setup rknn`"):
        find_toolkit_python()
    (toolkit_env_dir() / "hetsched-setup.json").write_text("{}")
    assert find_toolkit_python() == str(python)


def test_setup_command_lines(tmp_path: Path) -> None:
    d = tmp_path / "env"
    steps = setup_steps(d, torch="torch==2.13.0", python="/usr/bin/python3.11")
    assert [s.argv[:3] for s in steps[:1]] == [("/usr/bin/python3.11", "-m", "venv")]
    assert steps[0].argv[3] == str(d)
    env_python = str(d / "bin" / "python")
    deps, toolkit, check = steps[1].argv, steps[2].argv, steps[3].argv
    assert deps[:4] == (env_python, "-m", "pip", "install")
    assert set(REQUIREMENTS) <= set(deps) and deps[-1] == "torch==2.13.0"
    assert "--no-deps" not in deps
    assert "numpy<=1.26.4" in deps and "setuptools>=77,<81" in deps and "protobuf>=4.21.6,<=4.25.4" in deps
    assert toolkit[:4] == (env_python, "-m", "pip", "install")
    assert "--no-deps" in toolkit and toolkit[-1] == f"rknn-toolkit2=={TOOLKIT_VERSION}"
    assert not any(a.startswith("torch") for a in toolkit)
    assert check[0] == env_python and "rknn.api" in check[-1]
    # the default torch spec is the toolkit's own pin
    default = setup_steps(d, torch=DEFAULT_TORCH, python="py")
    assert default[1].argv[-1] == "torch>=1.10.1,<=2.4.0"


_FAKE_PYTHON = """#!/bin/sh
# "python -m venv DIR": make DIR/bin/python, a script that logs its arguments and fails
# when its first argument after -m pip install... matches $FAIL_ON
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  cat > "$3/bin/python" <<'EOS'
#!/bin/sh
echo "ran: $*" >> "$(dirname "$0")/../calls.txt"
echo "some pip chatter"
case "$*" in *"$FAIL_ON"*) echo "ERROR: No matching distribution found for $FAIL_ON"; exit 1;; esac
exit 0
EOS
  chmod +x "$3/bin/python"
  exit 0
fi
exit 9
"""


def test_setup_runs_steps_and_is_idempotent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAIL_ON", "never-matches")
    fake = _executable(tmp_path / "python3", _FAKE_PYTHON)
    d = tmp_path / "env"
    seen: list[SetupProgress] = []
    assert setup_toolkit_env(torch="torch==2.13.0", python=str(fake), directory=d, progress=seen.append) == d
    assert [(p.index, p.status) for p in seen] == [(i, s) for i in (1, 2, 3, 4) for s in ("start", "done")]
    assert all(p.seconds is not None and p.seconds >= 0 for p in seen if p.status == "done")
    calls = (d / "calls.txt").read_text().splitlines()
    assert len(calls) == 3 and "rknn-toolkit2==2.5.0" in calls[1] and "torch==2.13.0" in calls[0]
    assert json.loads((d / "hetsched-setup.json").read_text())["torch"] == "torch==2.13.0"
    assert "some pip chatter" in (d / env.LOG_NAME).read_text()
    # everything present: only the import check runs again
    seen.clear()
    setup_toolkit_env(torch="torch==2.13.0", python=str(fake), directory=d, progress=seen.append)
    assert [p.status for p in seen] == ["skipped", "skipped", "skipped", "start", "done"]
    assert len((d / "calls.txt").read_text().splitlines()) == 4
    # another torch spec: the pip steps run again in the same venv
    seen.clear()
    setup_toolkit_env(torch="torch==2.4.0", python=str(fake), directory=d, progress=seen.append)
    assert [p.status for p in seen] == ["skipped", "start", "done", "start", "done", "start", "done"]
    monkeypatch.setenv("HETSCHED_RKNN_PYTHON", str(d / "bin" / "python"))
    assert find_toolkit_python() == str(d / "bin" / "python")


def test_setup_failure_names_step_and_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAIL_ON", "rknn-toolkit2==")
    fake = _executable(tmp_path / "python3", _FAKE_PYTHON)
    d = tmp_path / "env"
    with pytest.raises(BackendUnavailableError) as info:
        setup_toolkit_env(torch="torch==2.13.0", python=str(fake), directory=d)
    message = str(info.value)
    assert "step 3/4" in message and "install rknn-toolkit2" in message and "exit status 1" in message
    assert "No matching distribution found for rknn-toolkit2==" in message
    assert str(d / env.LOG_NAME) in message
    assert not (d / "hetsched-setup.json").exists()  # an incomplete env is not used
    monkeypatch.delenv("HETSCHED_RKNN_PYTHON", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "nothing"))
    with pytest.raises(BackendUnavailableError):
        find_toolkit_python()


def test_cli_setup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAIL_ON", "never-matches")
    fake = _executable(tmp_path / "python3", _FAKE_PYTHON)
    d = tmp_path / "env"
    assert main(["setup", "rknn", "--torch", "torch==2.13.0", "--python", str(fake), "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert out.count(" done (") == 4 and "[4/4]" in out
    assert str(d) in out and f"HETSCHED_RKNN_PYTHON={d / 'bin' / 'python'}" in out
    monkeypatch.setenv("FAIL_ON", "onnxruntime")
    assert main(["setup", "rknn", "--torch", "torch==2.4.0", "--python", str(fake), "--dir", str(d)]) == 1
    captured = capsys.readouterr()
    assert "failed" in captured.out
    assert "install the toolkit's dependencies" in captured.err and str(d / env.LOG_NAME) in captured.err


def test_cli_setup_default_dir(no_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAIL_ON", "never-matches")
    fake = _executable(tmp_path / "python3", _FAKE_PYTHON)
    assert main(["setup", "rknn", "--python", str(fake)]) == 0
    out = capsys.readouterr().out
    assert str(toolkit_env_dir()) in out and "finds it there by itself" in out
    assert find_toolkit_python() == str(toolkit_env_dir() / "bin" / "python")
    assert os.access(find_toolkit_python(), os.X_OK)


# -- a lock on the folder, interrupted setups, progress (issue 22) ------------------------------

# Like _FAKE_PYTHON, but the first pip step (the toolkit's dependencies) says it started and then
# holds until the test opens the gate, so a second setup or a kill lands while it runs.
_GATED_PYTHON = _FAKE_PYTHON.replace(
    'echo "some pip chatter"\n',
    'echo "some pip chatter"\n'
    'case "$*" in *"onnx>="*) touch "$GATE/started"; n=0\n'
    '  while [ ! -e "$GATE/open" ]; do sleep 0.05; n=$((n+1)); [ $n -gt 6000 ] && exit 7; done;; esac\n',
)


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    """Until ``path`` exists (a guard, not a measurement: the deadline only bounds a broken run)."""
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _setup_process(fake: Path, d: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "hetsched", "setup", "rknn", "--torch", "torch==2.13.0",
                             "--python", str(fake), "--dir", str(d)],
                            cwd=d.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("FAIL_ON", "never-matches")
    monkeypatch.setenv("GATE", str(gate))
    return _executable(tmp_path / "python3", _GATED_PYTHON), gate, dict(os.environ)


def test_two_concurrent_setups_leave_one_environment(gated: tuple[Path, Path, dict[str, str]], tmp_path: Path) -> None:
    fake, gate, environ = gated
    d = tmp_path / "env"
    first = _setup_process(fake, d, environ)
    try:
        _wait_for(gate / "started", first)  # the first holds the folder, inside its pip step
        second = _setup_process(fake, d, environ)
        try:
            line = second.stdout.readline() if second.stdout else ""
            assert "waiting" in line and f"pid {first.pid}" in line, line
            assert len((d / "calls.txt").read_text().splitlines()) == 1  # the second ran nothing yet
            (gate / "open").touch()
            out1, _ = first.communicate(timeout=120)
            out2, _ = second.communicate(timeout=120)
        finally:
            second.kill()
    finally:
        first.kill()
    assert first.returncode == 0, out1
    assert second.returncode == 0, out2
    assert "[2/4] install the toolkit's dependencies: already done" in out2 and "[4/4]" in out2
    calls = (d / "calls.txt").read_text().splitlines()
    assert sum("onnx>=" in c for c in calls) == 1 and sum("rknn-toolkit2==" in c for c in calls) == 1
    assert len(calls) == 4  # the first's three steps, then the second's import check
    assert json.loads((d / "hetsched-setup.json").read_text()) == {"toolkit": TOOLKIT_VERSION, "torch": "torch==2.13.0"}


def test_an_interrupted_setup_is_never_used_and_the_next_rebuilds_it(
        gated: tuple[Path, Path, dict[str, str]], no_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, gate, environ = gated
    d = toolkit_env_dir()
    d.mkdir(parents=True)
    killed = _setup_process(fake, d, environ)
    try:
        _wait_for(gate / "started", killed)
    finally:
        killed.kill()  # SIGKILL inside pip: no cleanup of any kind runs
        killed.communicate()
    half = d / "lib" / "site-packages" / "numpy-1.26.4.dist-info"
    half.mkdir(parents=True)
    (half / "RECORD").write_text("numpy/__init__.py,")  # what a killed pip leaves: a half-written dist-info
    assert (d / "bin" / "python").exists()
    with pytest.raises(BackendUnavailableError, match="incomplete"):
        find_toolkit_python()  # a folder without the ready marker is never taken as ready
    (gate / "open").touch()
    seen: list[SetupProgress] = []
    setup_toolkit_env(torch="torch==2.13.0", python=str(fake), progress=seen.append)
    assert [(p.index, p.status) for p in seen][:2] == [(1, "start"), (1, "done")]  # the venv was made again
    assert not half.exists()
    assert len((d / "calls.txt").read_text().splitlines()) == 3  # only the new run's steps: a clean venv
    assert "some pip chatter" in (d / env.LOG_NAME).read_text()  # the log of both runs is kept
    assert find_toolkit_python() == str(d / "bin" / "python")


def test_a_folder_that_is_no_environment_is_refused_untouched(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("precious")
    with pytest.raises(BackendUnavailableError, match=r"no environment.*--dir"):
        setup_toolkit_env(torch="torch==2.13.0", python="/nonexistent/python", directory=d)
    assert (d / "thesis.tex").read_text() == "precious"


def test_progress_gives_each_step_an_eta_from_the_last_successful_run(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    monkeypatch.setenv("FAIL_ON", "never-matches")
    fake = _executable(tmp_path / "python3", _FAKE_PYTHON)
    d = tmp_path / "env"
    seen: list[SetupProgress] = []
    setup_toolkit_env(torch="torch==2.13.0", python=str(fake), directory=d, progress=seen.append)
    starts = [p for p in seen if p.status == "start"]
    assert [p.expected_s for p in starts] == list(env.STEP_ESTIMATES_S)  # nothing measured yet
    assert starts[0].remaining_s == sum(env.STEP_ESTIMATES_S)
    assert starts[1].remaining_s == sum(env.STEP_ESTIMATES_S[1:])
    took: dict[str, float] = {p.step: p.seconds for p in seen if p.status == "done"}  # type: ignore[misc]
    assert json.loads((d / "hetsched-setup-times.json").read_text()) == took
    seen.clear()  # another torch: steps 2-4 run again, expected to take what they took last time
    setup_toolkit_env(torch="torch==2.4.0", python=str(fake), directory=d, progress=seen.append)
    starts = [p for p in seen if p.status == "start"]
    assert [p.expected_s for p in starts] == [took[p.step] for p in starts]
    assert starts[0].remaining_s == pytest.approx(sum(took[p.step] for p in starts))


def test_cli_setup_prints_the_eta(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAIL_ON", "never-matches")
    fake = _executable(tmp_path / "python3", _FAKE_PYTHON)
    assert main(["setup", "rknn", "--python", str(fake), "--dir", str(tmp_path / "env")]) == 0
    out = capsys.readouterr().out
    assert "[2/4] install the toolkit's dependencies (about 50 s; 60 s left in all) ... done (" in out
