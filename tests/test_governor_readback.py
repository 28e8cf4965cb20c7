"""The governor's read-back after restoring on a live twin that does not update meanwhile (issue 13).

``benchmarks/governed_session.py`` advances its twin only from the session's hooks (and an
in-process twin task cannot run while the synchronous restore holds its event loop), so the
twin has not polled the restored governor when the port reads the knobs back: every knob
written reads back as saved, but ``scaling_setspeed`` still shows the frequency the
``userspace`` governor ran at, not ``<unsupported>``. The kernel renders that file from the
governor; it is no knob left changed, and follows at the twin's next update. A knob the
restore writes that does not read back is still warned about, naming its path and bytes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hetsched._governor import Governor, Phase, _sysfs
from hetsched._governor._sysfs import SysfsPort
from hetsched._platform._fs import SysfsRoot
from hetsched._twin.live import LiveTwin
from hetsched.testing import dvfs_knobs

LOGGER = "hetsched.governor"


class Board:
    """A twin driven by hand: it applies writes whenever the port waits, until ``frozen``
    (then, as in the benchmark while the governor restores, nothing advances it)."""

    def __init__(self, soc: str, root: Path) -> None:
        self.twin = LiveTwin(soc, root, noise=False)
        self.root = self.twin.write_once()
        self.t = 1000.0
        self.frozen = False

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        if not self.frozen:
            self.twin.advance(0.0)

    def governor(self) -> Governor:
        port = SysfsPort(self.root, clock=self.clock, sleep=self.sleep)
        return Governor(port=port, autotune=False, handle_signals=False, tick_period_s=0)

    def drive(self, gov: Governor) -> None:
        for _ in range(3):
            for phase in (Phase.FORWARD, Phase.IDLE):
                gov.on_phase(phase)
                self.t += 0.2
                self.twin.advance(0.2)


@pytest.fixture(params=["orin-nx", "rk3588"])
def board(request: pytest.FixtureRequest, tmp_path: Path) -> Board:
    return Board(request.param, tmp_path)


def _setspeed_paths(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.glob("sys/devices/system/cpu/cpufreq/policy*/scaling_setspeed"))


def test_a_set_speed_file_not_yet_re_rendered_is_no_knob_left_changed(
        board: Board, caplog: pytest.LogCaptureFixture) -> None:
    before = dvfs_knobs(board.root)
    speeds = _setspeed_paths(board.root)
    assert speeds and all(before[p] == b"<unsupported>\n" for p in speeds)
    gov = board.governor()
    caplog.set_level(logging.INFO, logger=LOGGER)
    with gov:
        board.drive(gov)
        during = dvfs_knobs(board.root)
        board.frozen = True
    # Governed through scaling_setspeed: it showed the userspace governor's frequency.
    assert all(during[p].strip().isdigit() for p in speeds)
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert warned == []
    # What the twin has not re-rendered is named with its saved and read-back bytes.
    lag = " ".join(r.getMessage() for r in caplog.records if r.name == LOGGER and "re-rendered" in r.getMessage())
    now = dvfs_knobs(board.root)
    stale = [p for p in speeds if now[p] != before[p]]
    assert stale
    for p in stale:
        assert f"{p}: saved {before[p]!r}, reads {now[p]!r}" in lag
    # Every knob the restore wrote reads back as saved at once; the rest at the twin's next update.
    assert {p: v for p, v in now.items() if p not in speeds and "userspace" not in p} == \
        {p: v for p, v in before.items() if p not in speeds}
    board.twin.advance(0.0)
    assert dvfs_knobs(board.root) == before


def test_a_written_knob_that_does_not_read_back_is_warned_with_its_bytes(
        board: Board, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = "sys/devices/system/cpu/cpufreq/policy0"
    before = dvfs_knobs(board.root)
    gov = board.governor()
    with gov:
        board.drive(gov)
        real = _sysfs.write_back

        def capped_after(fs: SysfsRoot, knobs: _sysfs.Knobs, **kw: list[str]) -> dict[str, object]:
            # Another writer (nvpmodel, a thermal daemon) caps the policy as it is restored.
            out = real(fs, knobs, **kw)
            if f"{policy}/scaling_max_freq" in knobs:
                fs.write_text(f"{policy}/scaling_max_freq", "1000\n")
            return dict(out)

        monkeypatch.setattr(_sysfs, "write_back", capped_after)
        board.frozen = True  # the cap stays as written, as a kernel would show it
        caplog.set_level(logging.INFO, logger=LOGGER)
    warned = " ".join(r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING)
    saved = before[f"{policy}/scaling_max_freq"]
    assert "knobs of cluster0 did not read back as saved" in warned
    assert f"{policy}/scaling_max_freq: saved {saved!r}, reads b'1000\\n'" in warned
