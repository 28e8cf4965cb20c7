"""Every Jetson EMC rate the kernel publishes, not just bpmp's min and max (issue 13).

Formats (docs/sources.md [orin-emc-rates]): L4T ``bpmp/debug/emc/possible_rates`` in kHz with a
trailing ``(kHz)``; upstream ``tegra186-emc`` ``emc/available_rates`` in Hz.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hetsched import UnsupportedFrequencyError
from hetsched._governor._sysfs import SysfsPort
from hetsched._platform import SysfsRoot, discover, jetson
from hetsched._platform.jetson import EMC_AVAILABLE_RATES, EMC_DIR, EMC_POSSIBLE_RATES, EmcInfo
from hetsched._twin.live import LiveTwin

from _platform_trees import orin_nx_tree, write_tree

NX_HZ = (204_000_000, 665_600_000, 2_133_000_000, 3_199_000_000)


# -- pure parsers -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "204000 665600 2133000 3199000 (kHz)\n",  # as L4T prints it
        "204000 665600 2133000 3199000 (kHz)",
        "204000 665600 2133000 3199000\n",  # no unit marker
        "3199000 204000 2133000 665600 204000 (KHZ)\n",  # any order, a duplicate
        b"204000 665600 2133000 3199000 (kHz)\n",
    ],
)
def test_possible_rates_khz_to_hz(text: str | bytes) -> None:
    assert jetson.parse_possible_rates(text) == NX_HZ


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "\n",
        " (kHz)\n",  # the marker and no rate
        "204000 abc 2133000 (kHz)\n",  # one bad token spoils the table
        "204000 665600 (MHz)\n",  # not the unit this file uses
        "(kHz) 204000 665600\n",  # marker not at the end
        "204000 -665600 (kHz)\n",
        "0 204000 (kHz)\n",
        "204000 99999999999 (kHz)\n",  # 100 THz: past any clock
        b"\xff\xfe\x00\x01",
        b"204000\x00665600",
    ],
)
def test_possible_rates_garbage_is_none(text: str | bytes | None) -> None:
    assert jetson.parse_possible_rates(text) is None


def test_available_rates_hz() -> None:
    # tegra186_emc_debug_available_rates_show(): "%lu" joined by single spaces, then "\n".
    assert jetson.parse_available_rates("204000000 665600000 2133000000 3199000000\n") == NX_HZ
    assert jetson.parse_available_rates("3199000000 204000000 665600000 2133000000 \n") == NX_HZ
    for bad in (None, "", "\n", "204000 665600 (kHz)\n", "204000000 x\n", "2e9\n"):
        assert jetson.parse_available_rates(bad) is None


def _emc(table: tuple[int, ...], lo: int | None, hi: int | None) -> EmcInfo:
    return EmcInfo(rate_hz=lo, min_rate_hz=lo, max_rate_hz=hi, locked=False, iso_cap_hz=None,
                   activity_path=None, available_hz=table)  # fmt: skip


def test_emc_rates_within_min_and_max_rate() -> None:
    assert jetson.emc_rates(_emc(NX_HZ, 204_000_000, 3_199_000_000)) == NX_HZ
    # nvpmodel capped max_rate at 2133 MHz: 3199 MHz is not offered.
    assert jetson.emc_rates(_emc(NX_HZ, 204_000_000, 2_133_000_000)) == NX_HZ[:3]
    assert jetson.emc_rates(_emc(NX_HZ, 665_600_000, 2_133_000_000)) == NX_HZ[1:3]
    assert jetson.emc_rates(_emc(NX_HZ, None, None)) == NX_HZ


def test_emc_rates_fall_back_to_min_and_max() -> None:
    assert jetson.emc_rates(_emc((), 204_000_000, 3_199_000_000)) == (204_000_000, 3_199_000_000)
    # a table that has nothing within the bounds is no better than none
    assert jetson.emc_rates(_emc((100_000_000,), 204_000_000, 3_199_000_000)) == (204_000_000, 3_199_000_000)


# -- read_emc on fixture trees ------------------------------------------------------


def _tree(tmp_path: Path, **files: str) -> SysfsRoot:
    """The Orin NX fixture without a rate table, plus ``files`` (keys: ``possible``, ``available``,
    ``max_rate``)."""
    t = orin_nx_tree(emc_rates=None)
    if "possible" in files:
        t[EMC_POSSIBLE_RATES] = files["possible"]
    if "available" in files:
        t[EMC_AVAILABLE_RATES] = files["available"]
    if "max_rate" in files:
        t[f"{EMC_DIR}/max_rate"] = files["max_rate"]
    return SysfsRoot(write_tree(tmp_path / "root", t))


def test_read_emc_table_l4t_then_upstream(tmp_path: Path) -> None:
    fs = _tree(tmp_path / "a", possible="204000 2133000 (kHz)\n", available="204000000 665600000\n")
    emc = jetson.read_emc(fs)
    assert emc is not None and emc.available_hz == (204_000_000, 2_133_000_000)  # L4T first
    fs = _tree(tmp_path / "b", available="204000000 665600000 2133000000 3199000000\n")
    emc = jetson.read_emc(fs)
    assert emc is not None and emc.available_hz == NX_HZ
    emc = jetson.read_emc(_tree(tmp_path / "c"))
    assert emc is not None and emc.available_hz == ()


def test_garbage_table_is_counted_logged_once_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fs = _tree(tmp_path, possible="204000 zzz (kHz)\n", available="204000000 665600000\n")
    with caplog.at_level(logging.WARNING, logger="hetsched.platform"):
        for _ in range(3):
            emc = jetson.read_emc(fs)
            assert emc is not None and emc.available_hz == (204_000_000, 665_600_000)
    assert fs.statistics().garbage_reads == 3
    assert sum("possible_rates" in r.getMessage() for r in caplog.records) == 1


# -- discovery --------------------------------------------------------------------


def test_discovery_offers_the_table(tmp_path: Path) -> None:
    p = discover(write_tree(tmp_path, orin_nx_tree()))
    mem = p.device("memory")
    assert mem is not None and mem.frequencies_hz == NX_HZ and mem.max_freq_hz == 3_199_000_000
    assert not any("rate table" in n for n in p.notes)


def test_discovery_drops_rates_above_max_rate(tmp_path: Path) -> None:
    fs = _tree(tmp_path, possible="204000 665600 2133000 3199000 (kHz)\n", max_rate="2133000000\n")
    mem = discover(fs).device("memory")
    assert mem is not None and mem.frequencies_hz == NX_HZ[:3]


@pytest.mark.parametrize("possible", [None, "garbage (kHz)\n"])
def test_discovery_falls_back_to_min_and_max(tmp_path: Path, possible: str | None) -> None:
    fs = _tree(tmp_path) if possible is None else _tree(tmp_path, possible=possible)
    p = discover(fs)
    mem = p.device("memory")
    assert mem is not None and mem.frequencies_hz == (204_000_000, 3_199_000_000)
    assert any("rate table" in n for n in p.notes)


def test_set_emc_rate_checks_the_published_table(tmp_path: Path) -> None:
    fs = _tree(tmp_path, possible="204000 665600 2133000 3199000 (kHz)\n", max_rate="2133000000\n")
    for hz in (1_000_000_000, 3_199_000_000):  # within min..max but not a rate; above max_rate
        with pytest.raises(UnsupportedFrequencyError):
            jetson.set_emc_rate(fs, hz)
    assert fs.read_int(f"{EMC_DIR}/mrq_rate_locked") == 0  # nothing written on refusal
    jetson.set_emc_rate(fs, 665_600_000)
    assert (fs.read_int(f"{EMC_DIR}/mrq_rate_locked"), fs.read_int(f"{EMC_DIR}/rate")) == (1, 665_600_000)
    # a list given by the caller still decides
    jetson.set_emc_rate(fs, 3_199_000_000, available_hz=NX_HZ)
    assert fs.read_int(f"{EMC_DIR}/rate") == 3_199_000_000


# -- the twins ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("soc", "text"),
    [
        ("orin-nx", "204000 665600 2133000 3199000 (kHz)\n"),
        ("orin-agx", "204000 665600 2133000 3199000 (kHz)\n"),
        ("orin-nano", "204000 665600 2133000 (kHz)\n"),
    ],
)
def test_twin_publishes_possible_rates_in_l4t_format(tmp_path: Path, soc: str, text: str) -> None:
    root = LiveTwin(soc, tmp_path).write_once()
    path = root / EMC_POSSIBLE_RATES
    assert path.read_text() == text
    assert path.stat().st_mode & 0o777 == 0o400 and path.parent.stat().st_mode & 0o777 == 0o700
    mem = discover(root).device("memory")
    assert mem is not None and mem.frequencies_hz == jetson.parse_possible_rates(text)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_governor_sets_a_middle_emc_rate_on_the_live_twin(tmp_path: Path) -> None:
    twin = LiveTwin("orin-nx", tmp_path, noise=False)
    root = twin.write_once()
    clock = _Clock()

    def sleep(s: float) -> None:
        clock.t += s
        twin.advance(0.0)

    port = SysfsPort(root, clock=clock, sleep=sleep)
    assert port.domains()["memory"].available_hz == NX_HZ
    rate = root / EMC_DIR / "rate"
    before = rate.read_text()
    saved = port.save()
    port.write("memory", 665_600_000)
    twin.advance(0.5)
    assert rate.read_text() == "665600000\n"
    assert port.read("memory") == 665_600_000
    port.restore(saved)
    twin.advance(0.5)
    assert rate.read_text() == before
    assert twin.statistics().writes_rejected == 0
