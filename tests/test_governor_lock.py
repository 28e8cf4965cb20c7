"""One governor per root (issue 13): ``run/hetsched/governor.lock`` held with ``flock`` for the
governor's life. A second governor (this process or another) is refused before it changes
anything, a SIGKILLed holder's lock goes with it, the lock file is never followed out of the
root, a dry run may watch beside a governing one, and ``hetsched restore`` leaves a live
holder's clocks alone unless forced."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hetsched
from hetsched import GovernorBusyError, GovernorError, SysfsError
from hetsched._cli import main
from hetsched._governor import Governor, Phase
from hetsched._governor._lock import RootLock, probe
from hetsched._governor._state_dir import StateDir
from hetsched._governor._state_walk import LOCK_FILE, RUN_DIR, SAVED_FILE, STATE_FILE
from hetsched._governor._sysfs import SysfsPort
from hetsched._platform._fs import SysfsRoot
from hetsched.testing import build_board_tree, dvfs_knobs

CPU0 = "sys/devices/system/cpu/cpufreq/policy0"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _governor(root: Path, clock: Clock, **kw: object) -> Governor:
    kw.setdefault("autotune", False)
    kw.setdefault("handle_signals", False)
    kw.setdefault("tick_period_s", 0)
    return Governor(root, clock=clock, **kw)  # type: ignore[arg-type]


def _drive(gov: Governor, clock: Clock, cycles: int = 3) -> None:
    for _ in range(cycles):
        for phase in (Phase.FORWARD, Phase.IDLE):
            gov.on_phase(phase)
            clock.t += 0.3


def _run_files(root: Path) -> dict[str, bytes]:
    d = root / RUN_DIR
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())} if d.is_dir() else {}


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def board(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    root = build_board_tree(tmp_path / "board", "rk3588")
    return root, dvfs_knobs(root)


def test_the_error_is_public_and_a_governor_error() -> None:
    assert hetsched.GovernorBusyError is GovernorBusyError and "GovernorBusyError" in hetsched.__all__
    assert issubclass(GovernorBusyError, GovernorError)
    import hetsched._errors as errors

    assert "GovernorBusyError" in errors.__all__ and "GovernorBusyError" in (errors.__doc__ or "")


def test_a_second_governor_in_this_process_is_refused_and_changes_nothing(board: tuple[Path, dict[str, bytes]]) -> None:
    root, before = board
    clock = Clock()
    first = _governor(root, clock)
    with first:
        _drive(first, clock)
        knobs, files = dvfs_knobs(root), _run_files(root)
        assert knobs != before and {SAVED_FILE, LOCK_FILE} <= set(files)
        assert files[LOCK_FILE] == f"{os.getpid()}\n".encode()
        assert json.loads(files[SAVED_FILE])["locked"] is True
        fds = _fds()
        second = _governor(root, clock)
        with pytest.raises(GovernorBusyError) as err:
            second.__enter__()
        assert err.value.pid == os.getpid() and err.value.root == str(root)
        assert str(root) in str(err.value) and f"pid {os.getpid()}" in str(err.value)
        assert dvfs_knobs(root) == knobs, "the refused governor changed a knob"
        assert _run_files(root) == files, "the refused governor touched the first one's files"
        assert _fds() == fds, "the refused governor leaked a descriptor"
        assert probe(SysfsRoot(root)).held is True
        _drive(first, clock)  # the first one still governs
    assert dvfs_knobs(root) == before
    assert not (root / "run").exists(), "a closed governor leaves its lock (or its directory) behind"
    # Once it is closed, the next one starts, governs and restores.
    third = _governor(root, clock)
    with third:
        _drive(third, clock)
        assert dvfs_knobs(root) != before
    assert dvfs_knobs(root) == before and not (root / "run").exists()


_TRY = textwrap.dedent(
    """
    import sys
    from hetsched import GovernorBusyError
    from hetsched._governor import Governor
    gov = Governor(sys.argv[1], autotune=False, handle_signals=False, tick_period_s=0, clock=lambda: 0.0)
    try:
        gov.__enter__()
    except GovernorBusyError as exc:
        print("busy", exc.pid, flush=True)
        sys.exit(3)
    gov.__exit__(None, None, None)
    print("governed", flush=True)
    """
)


def _other_process(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _TRY, str(root)], capture_output=True, text=True, timeout=120)


def test_a_governor_in_another_process_is_refused(board: tuple[Path, dict[str, bytes]]) -> None:
    root, before = board
    clock = Clock()
    with _governor(root, clock) as gov:
        _drive(gov, clock)
        knobs, files = dvfs_knobs(root), _run_files(root)
        done = _other_process(root)
        assert done.returncode == 3, done.stderr
        assert done.stdout.split() == ["busy", str(os.getpid())]
        assert dvfs_knobs(root) == knobs and _run_files(root) == files
    done = _other_process(root)  # the root is free again
    assert done.returncode == 0 and done.stdout.strip() == "governed", done.stderr
    assert dvfs_knobs(root) == before and not (root / "run").exists()


_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from hetsched._governor import Governor, Phase
    t = [0.0]
    gov = Governor(sys.argv[1], autotune=False, handle_signals=False, tick_period_s=0, clock=lambda: t[0])
    gov.__enter__()
    for _ in range(3):
        for phase in (Phase.FORWARD, Phase.IDLE):
            gov.on_phase(phase)
            t[0] += 0.3
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _killed_holder(root: Path) -> int:
    done = subprocess.run([sys.executable, "-c", _KILLED, str(root)], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    pid = int((root / RUN_DIR / LOCK_FILE).read_text())
    assert json.loads((root / RUN_DIR / SAVED_FILE).read_text())["pid"] == pid
    return pid


def test_a_sigkilled_holders_lock_goes_with_it_and_the_next_governor_recovers(
    board: tuple[Path, dict[str, bytes]],
) -> None:
    root, before = board
    _killed_holder(root)
    assert dvfs_knobs(root) != before
    assert probe(SysfsRoot(root)).held is False  # its file stays, its lock does not
    clock = Clock()
    with _governor(root, clock) as gov:
        assert dvfs_knobs(root) == before  # the dead run's clocks put back before saving
        assert (root / RUN_DIR / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        assert json.loads((root / RUN_DIR / SAVED_FILE).read_text())["pid"] == os.getpid()
        _drive(gov, clock)
    # The directories the dead run made stay (empty); nothing of either run is left in them.
    assert dvfs_knobs(root) == before and _run_files(root) == {}


def test_a_locked_file_whose_pid_was_reused_is_a_dead_governors(
    board: tuple[Path, dict[str, bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, before = board
    _killed_holder(root)
    saved = root / RUN_DIR / SAVED_FILE
    doc = json.loads(saved.read_text())
    doc["pid"] = 1  # pid 1 always runs: the killed governor's pid taken by another process
    saved.write_text(json.dumps(doc))
    assert main(["restore", "--root", str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "restored" and out["pid"] == 1
    assert dvfs_knobs(root) == before
    assert _run_files(root).keys() == {STATE_FILE}  # the dead run's lock and saved file are gone


def test_hetsched_restore_refuses_a_live_holders_file_unless_forced(
    board: tuple[Path, dict[str, bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, before = board
    clock = Clock()
    with _governor(root, clock) as gov:
        _drive(gov, clock)
        knobs, files = dvfs_knobs(root), _run_files(root)
        assert main(["restore", "--root", str(root), "--json"]) == 1
        out = json.loads(capsys.readouterr().out)
        assert out["status"] == "refused" and out["pid"] == os.getpid()
        assert "holds the governor lock" in out["message"] and "--force" in out["message"]
        assert dvfs_knobs(root) == knobs and _run_files(root) == files
        assert StateDir(SysfsRoot(root)).restore_saved(force=True).status == "restored"
        assert dvfs_knobs(root) == before
    assert dvfs_knobs(root) == before and not (root / "run").exists()


def test_an_older_governors_file_without_a_lock_still_goes_by_its_pid(board: tuple[Path, dict[str, bytes]]) -> None:
    root, before = board
    knob = f"{CPU0}/scaling_governor"
    (root / RUN_DIR).mkdir(parents=True)
    (root / RUN_DIR / SAVED_FILE).write_text(json.dumps({"pid": 1, "knobs": {"cluster0": {knob: "ondemand\n"}}}))
    (root / knob).write_text("userspace\n")
    knobs, files = dvfs_knobs(root), _run_files(root)
    clock = Clock()
    with pytest.raises(GovernorBusyError, match=r"still runs \(pid 1\)") as err:
        _governor(root, clock).__enter__()
    assert err.value.pid == 1
    assert dvfs_knobs(root) == knobs and _run_files(root) == files
    # Its pid gone (injected): put back, as before.
    assert StateDir(SysfsRoot(root)).restore_saved(alive=lambda pid: False).status == "restored"
    assert dvfs_knobs(root) == before


@pytest.mark.parametrize("dangling", [False, True])
def test_a_lock_link_out_of_the_root_is_refused_and_its_target_untouched(
    board: tuple[Path, dict[str, bytes]], tmp_path: Path, dangling: bool
) -> None:
    root, before = board
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "victim"
    if not dangling:
        target.write_bytes(b"precious\n")
    (root / RUN_DIR).mkdir(parents=True)
    os.symlink(target, root / RUN_DIR / LOCK_FILE)
    with pytest.raises(SysfsError, match=LOCK_FILE):
        _governor(root, Clock()).__enter__()
    assert dvfs_knobs(root) == before
    assert [p.name for p in outside.iterdir()] == ([] if dangling else ["victim"])
    if not dangling:
        assert target.read_bytes() == b"precious\n"
    assert (root / RUN_DIR / LOCK_FILE).is_symlink() and os.listdir(root / RUN_DIR) == [LOCK_FILE]


def test_a_run_directory_link_out_of_the_root_is_refused(board: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, before = board
    outside = tmp_path / "host-run"
    outside.mkdir()
    os.symlink(outside, root / "run")
    with pytest.raises(SysfsError):
        _governor(root, Clock()).__enter__()
    assert list(outside.iterdir()) == [] and dvfs_knobs(root) == before


def test_a_dry_run_beside_a_governing_one_runs_and_touches_nothing(board: tuple[Path, dict[str, bytes]]) -> None:
    root, before = board
    clock = Clock()
    with _governor(root, clock) as gov:
        _drive(gov, clock)
        knobs, files = dvfs_knobs(root), _run_files(root)
        assert STATE_FILE in files
        with _governor(root, clock, dry_run=True) as dry:
            _drive(dry, clock)
            assert dry.statistics().decisions > 0
        assert dvfs_knobs(root) == knobs and _run_files(root) == files
        assert probe(SysfsRoot(root)).held is True
    assert dvfs_knobs(root) == before and not (root / "run").exists()


def test_a_lock_on_a_file_unlinked_meanwhile_is_not_the_roots(board: tuple[Path, dict[str, bytes]]) -> None:
    """The release race: a governor that opened the lock file just before its holder removed
    it must not take a lock on the unlinked inode for the root's (a third would lock a new file)."""
    root, _ = board
    fs = SysfsRoot(root)
    first = RootLock.acquire(fs)
    path = root / RUN_DIR / LOCK_FILE
    stale = os.open(path, os.O_RDWR)  # a racer's open, before the holder's release
    try:
        first.release()
        assert not path.exists()
        fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # it can lock that inode now: it is no lock
        second = RootLock.acquire(fs)  # a fresh file, not blocked by the stale inode's lock
        try:
            assert os.fstat(stale).st_ino != path.stat().st_ino
            with pytest.raises(GovernorBusyError):
                RootLock.acquire(fs)
        finally:
            second.release()
    finally:
        os.close(stale)
    assert not (root / "run").exists()


def test_an_acquirer_that_opened_the_file_before_its_release_starts_over(
    board: tuple[Path, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race from the acquirer's side: it opened the old file, the holder released (and
    removed) it, then it got the lock on that unlinked inode: it must start over on a new file."""
    import hetsched._governor._lock as lock_mod

    root, _ = board
    fs = SysfsRoot(root)
    holder = RootLock.acquire(fs)
    real = fcntl.flock
    calls: list[int] = []

    def flock(fd: int, op: int) -> None:
        if not calls:
            holder.release()  # between this acquirer's open and its flock
        calls.append(fd)
        real(fd, op)

    monkeypatch.setattr(lock_mod.fcntl, "flock", flock)
    second = RootLock.acquire(fs)
    monkeypatch.undo()
    try:
        assert len(calls) == 2, "it did not start over after locking an unlinked file"
        with pytest.raises(GovernorBusyError):
            RootLock.acquire(fs)  # a third one finds the root owned
    finally:
        second.release()


def test_a_failed_save_drops_the_lock(board: tuple[Path, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = board
    port = SysfsPort(root, clock=Clock(), sleep=lambda s: None)

    def boom(self: SysfsPort) -> dict[str, dict[str, bytes | None]]:
        raise SysfsError(5, "read failed")

    monkeypatch.setattr(SysfsPort, "_read_knobs", boom)
    with pytest.raises(SysfsError, match="read failed"):
        port.save()
    assert not port.locked and not (root / "run").exists()
    monkeypatch.undo()
    saved = port.save()
    assert port.locked
    port.restore(saved)
    assert not port.locked and not (root / "run").exists()


def test_doctor_and_top_judge_a_reused_pid_by_the_lock(board: tuple[Path, dict[str, bytes]]) -> None:
    from hetsched._cli._doctor_checks_read import findings, read_board
    from hetsched._cli._top import read_session_view

    root, _ = board
    _killed_holder(root)
    for name in (SAVED_FILE, STATE_FILE):
        path = root / RUN_DIR / name
        doc = json.loads(path.read_text())
        doc["pid"] = 1  # pid 1 always runs: the killed governor's pid taken by another process
        path.write_text(json.dumps(doc))
    assert probe(SysfsRoot(root)).held is False
    found = [f for f in findings(read_board(root, window_s=0)) if f.check == "governor"]
    # Not "a hetsched governor runs (pid 1)": the clocks it left changed are reported.
    assert found and all("runs" not in f.message for f in found)
    assert any(f.status == "fail" and "died" in f.message for f in found)
    assert read_session_view(SysfsRoot(root)).governor_alive is False
