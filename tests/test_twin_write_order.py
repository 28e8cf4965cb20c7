"""The live twin replays writes in the order they were made, as a kernel applies them."""

from __future__ import annotations

from hetsched._platform import SysfsRoot
from hetsched._platform.jetson import read_emc, set_emc_rate
from hetsched._twin.live import LiveTwin


def test_emc_lock_then_rate_between_two_polls(tmp_path) -> None:
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
