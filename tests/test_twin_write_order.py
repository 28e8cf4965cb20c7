"""The live twin replays writes in the order they were made, as a kernel applies them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetsched._platform import SysfsRoot
from hetsched._platform.jetson import read_emc, set_emc_rate
from hetsched._twin.live import LiveTwin
from hetsched._twin.state import BoardState


def test_emc_lock_then_rate_between_two_polls(tmp_path: Path) -> None:
    twin = LiveTwin("orin-nx", tmp_path)
    twin.write_once()
    fs = SysfsRoot(tmp_path)
    before = read_emc(fs)
    assert before is not None and before.rate_hz != 665_600_000
    set_emc_rate(fs, 665_600_000)  # writes mrq_rate_locked=1, then rate, before any poll
    twin.advance(0.5)
    after = read_emc(fs)
    assert after is not None and after.locked is True
    assert after.rate_hz == 665_600_000


def test_a_write_landing_between_the_poll_and_the_render_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A governor's restore that writes a knob while the twin applies an earlier write of it must
    # not be replaced by the twin's render of the earlier value (a kernel applies both in turn).
    twin = LiveTwin("rk3588", tmp_path)
    twin.write_once()
    knob = tmp_path / "sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq"
    avail = (tmp_path / "sys/devices/system/cpu/cpufreq/policy4/scaling_available_frequencies").read_text().split()
    low, top = avail[0], avail[-1]
    assert knob.read_text().strip() == top
    knob.write_text(low + "\n")  # the governor caps the cluster
    render = twin._render_state

    def restore_then_render(state: BoardState) -> None:  # the restore arrives after the poll read the cap
        knob.write_text(top + "\n")
        render(state)

    monkeypatch.setattr(twin, "_render_state", restore_then_render)
    twin.poll_writes()
    assert knob.read_text().strip() == top  # kept, not re-rendered as the cap
    monkeypatch.setattr(twin, "_render_state", render)
    twin.poll_writes()  # the next poll applies the restore, as the kernel would
    assert knob.read_text().strip() == top
    assert twin.sim.user_limits("cluster4")[1] == int(top) * 1000  # the restore was applied


def test_a_knob_rerendered_by_another_write_keeps_a_write_made_meanwhile(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Applying one knob (the GPU's max_freq) re-renders another (its min_freq, shown as at most the
    # max); a restore that wrote min_freq after the poll read it must not be replaced by that
    # render: the next poll applies it (the test_sigterm_restores_every_knob flake).
    twin = LiveTwin("rk3588", tmp_path)
    twin.write_once()
    df = tmp_path / "sys/class/devfreq/fb000000.gpu"
    avail = sorted(int(v) for v in (df / "available_frequencies").read_text().split())
    (df / "min_freq").write_text(f"{avail[-1]}\n")  # the governor pins the GPU at its top
    twin.poll_writes()
    assert int((df / "min_freq").read_text()) == avail[-1]
    (df / "max_freq").write_text(f"{avail[0]}\n")  # a cap: min_freq now shows the lowest
    render = twin._render_state

    def restore_then_render(state: BoardState) -> None:
        (df / "min_freq").write_text(f"{avail[1]}\n")  # the restore, after the poll read min_freq
        render(state)

    monkeypatch.setattr(twin, "_render_state", restore_then_render)
    twin.poll_writes()
    assert int((df / "min_freq").read_text()) == avail[1]  # kept, not re-rendered from the old state
    monkeypatch.setattr(twin, "_render_state", render)
    twin.poll_writes()
    assert twin.sim.user_limits("gpu")[0] == avail[1]  # and applied by the next poll
