"""Restore and safety on bad trees (issue 13): a garbage knob never aborts the restore, a knob that
cannot be restored is never changed, a killed governor's clocks are put back (next start,
``hetsched restore``), garbage sysfs content never crashes ``top`` or a governed run, and a
binary profile is a ProfileError."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hetsched import SysfsError
from hetsched._cli import main
from hetsched._cli._top import format_frame
from hetsched._errors import ProfileError
from hetsched._governor import Governor, GovernorProfile, Phase
from hetsched._governor._state_dir import StateDir
from hetsched._governor._state_walk import RUN_DIR, SAVED_FILE
from hetsched._governor._sysfs import SysfsPort
from hetsched._platform import thermal
from hetsched._platform._fs import SysfsRoot, parse_int, parse_name
from hetsched._platform.telemetry import Telemetry
from hetsched._snapshot import DomainState, Snapshot
from hetsched.testing import build_board_tree, dvfs_knobs

CPU0 = "sys/devices/system/cpu/cpufreq/policy0"
CPU4 = "sys/devices/system/cpu/cpufreq/policy4"
RK_GPU = "sys/class/devfreq/fb000000.gpu"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _drive(gov: Governor, clock: Clock, cycles: int = 3) -> None:
    for _ in range(cycles):
        for phase in (Phase.FORWARD, Phase.IDLE):
            gov.on_phase(phase)
            clock.t += 0.3


def _governor(root: Path, clock: Clock, **kw: object) -> Governor:
    kw.setdefault("autotune", False)
    kw.setdefault("handle_signals", False)
    kw.setdefault("tick_period_s", 0)
    return Governor(root, clock=clock, **kw)  # type: ignore[arg-type]


def _files(root: Path, policy: str) -> dict[str, bytes]:
    return {k: v for k, v in dvfs_knobs(root).items() if k.startswith(policy + "/")}


# -- 1. one undecodable knob does not abort the restore ------------------------------------------


@pytest.mark.parametrize("soc", ["rk3588", "orin-nx"])
def test_a_binary_setspeed_does_not_abort_the_restore(soc: str, tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, soc)
    (root / CPU0 / "scaling_setspeed").write_bytes(b"\xff\xfe\x00\x9c\n")
    before = dvfs_knobs(root)
    clock = Clock()
    gov = _governor(root, clock)
    with gov:
        _drive(gov, clock)
        during = dvfs_knobs(root)
    changed = [k for k in before if during[k] != before[k]]
    assert len(changed) >= 6, "the governor must have changed knobs of several domains"
    assert any(k.startswith(CPU0) for k in changed)  # that policy is governed (its set-speed is not needed)
    assert dvfs_knobs(root) == before
    assert gov.statistics().restored


@pytest.mark.parametrize("soc", ["rk3588", "orin-nx"])
def test_every_other_knob_is_restored_and_the_failed_ones_reported(soc: str, tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, soc)
    before = dvfs_knobs(root)
    port = SysfsPort(root, clock=Clock(), sleep=lambda s: None, restore_settle_s=0)
    saved = port.save()
    for name, spec in port.domains().items():
        port.write(name, spec.min_hz)
    assert dvfs_knobs(root) != before
    # A saved value that is no value (a corrupted read), and a write the kernel refuses.
    saved["cluster0"][f"{CPU0}/scaling_governor"] = b"\xff\xfe\n"
    refused = f"{CPU4}/scaling_max_freq"
    real = SysfsRoot.write_text

    def write(self: SysfsRoot, rel: object, value: object) -> None:
        if rel == refused:
            raise SysfsError(errno.EBUSY, f"writing to {rel} failed: Device or resource busy")
        real(self, rel, value)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SysfsRoot, "write_text", write)
        with pytest.raises(SysfsError) as info:
            port.restore(saved)
    msg = str(info.value)
    assert f"{CPU0}/scaling_governor" in msg and refused in msg and "2 clock knobs" in msg
    assert set(port.restore_failures) == {f"{CPU0}/scaling_governor", refused}
    after = dvfs_knobs(root)
    left = {k for k in before if after[k] != before[k]}
    assert left == {f"{CPU0}/scaling_governor", refused}


# -- 2. a knob that cannot be restored is never changed ------------------------------------------


@pytest.mark.parametrize(
    ("knob", "content"),
    [("scaling_min_freq", b"\xff\xfe\n"), ("scaling_governor", b"bogus-governor\n"), ("scaling_max_freq", b"12abc\n")],
)
def test_a_domain_whose_knobs_cannot_be_restored_is_left_alone(
    knob: str, content: bytes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    (root / CPU4 / knob).write_bytes(content)
    before = dvfs_knobs(root)
    clock = Clock()
    with caplog.at_level(logging.WARNING, "hetsched.governor"):
        gov = _governor(root, clock)
        assert "cluster4" not in gov.engine.domains
        with gov:
            _drive(gov, clock)
            during = dvfs_knobs(root)
    assert any(f"{CPU4}/{knob}" in r.getMessage() and "leaving cluster4 alone" in r.getMessage() for r in caplog.records)
    assert _files(root, CPU4) == {k: v for k, v in before.items() if k.startswith(CPU4 + "/")}
    assert {k: during[k] for k in during if k.startswith(CPU4 + "/")} == _files(root, CPU4)
    assert during != before  # the other domains were governed
    assert dvfs_knobs(root) == before


def test_a_knob_that_turns_to_garbage_before_the_save_is_not_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    clock = Clock()
    gov = _governor(root, clock)
    assert "gpu" in gov.engine.domains
    (root / RK_GPU / "max_freq").write_bytes(b"\x00\x00\x00\x00")
    before = dvfs_knobs(root)
    with caplog.at_level(logging.WARNING, "hetsched.governor"), gov:
        _drive(gov, clock)
        gpu_during = {k: v for k, v in dvfs_knobs(root).items() if k.startswith(RK_GPU)}
    assert gpu_during == {k: v for k, v in before.items() if k.startswith(RK_GPU)}
    assert any("leaving gpu alone" in r.getMessage() and "max_freq" in r.getMessage() for r in caplog.records)
    assert dvfs_knobs(root) == before


# -- 3. a killed governor: the next start and `hetsched restore` put its clocks back ------------------

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
    print(gov.statistics().writes, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _killed_governor(root: Path) -> int:
    """Run a governor in a process that is SIGKILLed mid-run; return its pid."""
    done = subprocess.run([sys.executable, "-c", _KILLED, str(root)], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    assert int(done.stdout.split()[0]) > 0
    doc = json.loads((root / RUN_DIR / SAVED_FILE).read_text())
    return int(doc["pid"])


@pytest.fixture(params=["rk3588", "orin-nx"])
def killed(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    root = build_board_tree(tmp_path, request.param)
    before = dvfs_knobs(root)
    _killed_governor(root)
    assert dvfs_knobs(root) != before, "the killed governor left no clock changed"
    return root, before


def test_the_next_governor_restores_a_killed_ones_clocks_before_saving(
    killed: tuple[Path, dict[str, bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    root, before = killed
    clock = Clock()
    gov = _governor(root, clock)
    with caplog.at_level(logging.WARNING, "hetsched.governor"), gov:
        assert dvfs_knobs(root) == before  # put back before this run saved anything
        saved = json.loads((root / RUN_DIR / SAVED_FILE).read_text())
        assert saved["pid"] == os.getpid()
        _drive(gov, clock)
    assert any("restored" in r.getMessage() and "gone" in r.getMessage() for r in caplog.records)
    assert dvfs_knobs(root) == before  # the originals, not the dead run's clocks
    assert not (root / RUN_DIR / SAVED_FILE).exists()


def test_hetsched_restore_puts_back_a_killed_governors_clocks(
    killed: tuple[Path, dict[str, bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, before = killed
    assert main(["restore", "--root", str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "restored" and out["written"] and not out["failed"]
    assert dvfs_knobs(root) == before
    assert not (root / RUN_DIR / SAVED_FILE).exists()
    assert main(["restore", "--root", str(root)]) == 0
    assert "nothing to restore" in capsys.readouterr().out


def test_hetsched_restore_refuses_a_running_governors_file_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    before = dvfs_knobs(root)
    (root / RUN_DIR).mkdir(parents=True)
    knob = f"{CPU0}/scaling_governor"
    # pid 1 always runs: another process's governor, as far as this one can tell.
    (root / RUN_DIR / SAVED_FILE).write_text(json.dumps({"pid": 1, "knobs": {"cluster0": {knob: "ondemand\n"}}}))
    (root / knob).write_text("userspace\n")
    assert main(["restore", "--root", str(root), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "refused" and "still runs (pid 1)" in out["message"]
    assert (root / knob).read_text() == "userspace\n" and (root / RUN_DIR / SAVED_FILE).exists()
    assert main(["restore", "--root", str(root), "--force"]) == 0
    assert dvfs_knobs(root) == before and not (root / RUN_DIR / SAVED_FILE).exists()


def test_a_partial_restore_exits_1_keeps_the_file_and_the_next_run_keeps_the_originals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    before = dvfs_knobs(root)
    _killed_governor(root)
    stuck = f"{CPU4}/scaling_governor"
    assert (root / stuck).read_bytes() != before[stuck]
    real = SysfsRoot.write_text

    def write(self: SysfsRoot, rel: object, value: object) -> None:
        if rel == stuck:
            raise SysfsError(errno.EBUSY, f"writing to {rel} failed: Device or resource busy")
        real(self, rel, value)  # type: ignore[arg-type]

    monkeypatch.setattr(SysfsRoot, "write_text", write)
    assert main(["restore", "--root", str(root), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "partial" and list(out["failed"]) == [stuck] and out["left"] == [stuck]
    assert (root / RUN_DIR / SAVED_FILE).exists()
    after = dvfs_knobs(root)
    assert {k for k in before if after[k] != before[k]} == {stuck}
    # The next governor cannot put it back either: it saves the board's own value for it, not the
    # dead run's, so that its own restore (or a later one) writes the original.
    port = SysfsPort(root, clock=Clock(), sleep=lambda s: None)
    saved = port.save()
    assert saved["cluster4"][stuck] == before[stuck]


def test_the_saved_file_of_a_governor_in_this_process_that_failed_to_restore_is_recovered(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    before = dvfs_knobs(root)
    clock = Clock()
    gov = _governor(root, clock)
    gov.__enter__()
    _drive(gov, clock)
    gov.engine._restored = True  # as if its restore had failed: the file stays, the clocks changed
    gov.engine._published.closed(restored=False)
    assert dvfs_knobs(root) != before and (root / RUN_DIR / SAVED_FILE).exists()
    out = StateDir(SysfsRoot(root)).restore_saved()
    assert out.status == "restored" and dvfs_knobs(root) == before


def test_a_dry_run_warns_about_a_dead_governors_clocks_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    _killed_governor(root)
    left = dvfs_knobs(root)
    clock = Clock()
    with caplog.at_level(logging.WARNING, "hetsched.governor"), _governor(root, clock, dry_run=True) as gov:
        _drive(gov, clock)
    assert dvfs_knobs(root) == left
    assert any("hetsched restore --root" in r.getMessage() for r in caplog.records)


# -- 4. garbage sysfs content ----------------------------------------------------------------------


def _zone0(root: Path) -> Path:
    return sorted((root / "sys/class/thermal").glob("thermal_zone*"))[0]


GARBAGE = {
    "21-digit temperature": lambda r: (_zone0(r) / "temp").write_text("1" * 21 + "\n"),
    "nan temperature": lambda r: (_zone0(r) / "temp").write_text("nan\n"),
    "binary governor": lambda r: (r / CPU0 / "scaling_governor").write_bytes(b"\xff\xfe\x00gov\n"),
    "negative clock": lambda r: (r / CPU0 / "scaling_cur_freq").write_text("-5\n"),
    "huge clock": lambda r: (r / CPU0 / "scaling_cur_freq").write_text("9" * 30 + "\n"),
    "binary minimum": lambda r: (r / CPU0 / "scaling_min_freq").write_bytes(b"\xff\xfe\n"),
    "runaway trip": lambda r: (_zone0(r) / "trip_point_0_temp").write_text("7" * 5000 + "\n"),
}


@pytest.mark.parametrize(
    ("soc", "what"),
    [("rk3588", w) for w in sorted(GARBAGE)]
    + [("orin-nx", w) for w in ("21-digit temperature", "binary governor", "binary minimum")],
)
def test_garbage_sysfs_content_does_not_crash_top_or_a_governed_run(
    soc: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = build_board_tree(tmp_path, soc)
    GARBAGE[what](root)
    before = dvfs_knobs(root)
    assert main(["top", "--root", str(root), "--interval", "0.01", "--iterations", "2"]) == 0
    assert "hetsched top" in capsys.readouterr().out
    clock = Clock()
    gov = _governor(root, clock)
    with gov:
        _drive(gov, clock)
    assert gov.statistics().writes > 0
    assert dvfs_knobs(root) == before


def test_doctor_reads_garbage_content_without_crashing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i, what in enumerate(sorted(GARBAGE)):
        root = build_board_tree(tmp_path / str(i), "rk3588")
        GARBAGE[what](root)
        assert main(["doctor", "--root", str(root), "--window", "0", "--json"]) in (0, 1), what
        assert isinstance(json.loads(capsys.readouterr().out), list)


def test_garbage_reads_are_counted_logged_once_and_read_as_absent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    zone = _zone0(root)
    (zone / "temp").write_text("1" * 21 + "\n")
    fs = SysfsRoot(root)
    tm = Telemetry(fs)
    with caplog.at_level(logging.WARNING, "hetsched.platform"):
        snaps = [tm.sample_once() for _ in range(3)]
    name = (zone / "type").read_text().strip()
    assert all(s.zones[name].temp_c is None for s in snaps)
    assert all(z.temp_c is not None for s in snaps for n, z in s.zones.items() if n != name and "cv" not in n)
    assert sum(f"{zone.name}/temp" in r.getMessage() for r in caplog.records) == 1
    assert fs.statistics().garbage_reads >= 3


def test_the_number_and_name_parsers_refuse_garbage() -> None:
    assert parse_int(b"44384\n") == 44384 and parse_int(b"-256000\n") == -256000
    for bad in (b"1" * 21, b"nan", b"1_000", b"\xff\xfe", b"12 34", b"", b"0x10"):
        assert parse_int(bad) is None, bad
    assert parse_int(b"-5", lo=0) is None and parse_int(b"5", hi=4) is None
    assert parse_name(b"schedutil\n") == "schedutil" and parse_name(b"dmc_ondemand") == "dmc_ondemand"
    for bad in (b"\xff\xfe\x00gov\n", b"two words", b"", b"x" * 100):
        assert parse_name(bad) is None, bad
    assert thermal.parse_temp_c("1" * 21) is None and thermal.parse_temp_c("600000") is None
    assert thermal.parse_temp_c("-274000") is None and thermal.parse_temp_c("115000") == 115.0


def test_top_marks_a_clock_outside_its_limits_instead_of_hiding_it() -> None:
    def frame(freq: int) -> str:
        d = DomainState("cluster4", "cpu", freq, (408_000_000, 1_800_000_000), 1_800_000_000, 1_800_000_000)
        return format_frame(Snapshot(time_s=1.0, domains={"cluster4": d}), root="/", interval=1.0)

    below = frame(408_000_000).splitlines()
    row = next(line for line in below if line.startswith("cluster4"))
    assert "408*" in row  # what the file says, marked
    assert any("outside its min..max" in line for line in below)
    fine = frame(1_800_000_000)
    assert "*" not in fine and "outside" not in fine


# -- 5. a profile that is no profile ---------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe\x00\x01\x02binary", b"\x89PNG\r\n\x1a\n", b"not json", b"[1, 2]", b"[" * 100_000 + b"]" * 100_000,
     b'{"format": "hetsched.governor-profile", "version": 1, "workload": "w", "slowdown": NaN, "phases": {},'
     b' "board": {"soc": null, "domains": {}}}',
     b'{"format": "hetsched.governor-profile", "version": 1, "workload": "w", "slowdown": 0.05, "board":'
     b' {"soc": null, "domains": {}}, "phases": {"forward": {"center": {"gpu": 1}, "at_center": [1, 1],'
     b' "axes": {"gpu": {"abc": [1, 1]}}}}}'],
    ids=["binary", "png", "text", "list", "deep", "nan", "schema"],
)
def test_a_profile_that_is_no_profile_is_a_profile_error(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "gov.json"
    path.write_bytes(content)
    with pytest.raises(ProfileError, match=str(path)):
        GovernorProfile.load(path)
    root = build_board_tree(tmp_path / "board", "rk3588")
    with pytest.raises(ProfileError, match=str(path)):
        Governor(root, profile=path, handle_signals=False)


def test_a_run_link_swapped_in_after_start_is_not_followed(tmp_path: Path) -> None:
    """The state directory is walked with O_NOFOLLOW at every write: a link planted in
    ``run/`` after the writer resolved it is refused, and nothing outside changes."""
    import os

    from hetsched._governor._state_walk import RunDir
    from hetsched._platform._fs import SysfsRoot

    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    d = RunDir(SysfsRoot(root))
    d.write("governor-state.json", {"phase": "idle"})
    assert (root / "run" / "hetsched" / "governor-state.json").exists()
    d.remove("governor-state.json")
    d.tidy()
    assert not (root / "run" / "hetsched").exists()
    # Now swap a link to the outside directory in where the writer will create its directory.
    os.symlink(outside, root / "run" / "hetsched")
    import pytest

    with pytest.raises(OSError, match=r"symbolic links|Not a directory"):
        d.write("governor-state.json", {"phase": "idle"})
    assert list(outside.iterdir()) == []
