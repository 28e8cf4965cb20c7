"""``Runtime.statistics()``: the board's energy where the board measures it (issue 26).

On a root with a measured board-input rail (the orin-nx twin, a Jetson) the runtime integrates
``VDD_IN`` from its opening to each ``statistics()`` call (until it closes), idle time included,
and splits that total by each session's share of the devices' busy time; the stages' modelled
sum stays beside it. The RK3588 has no power monitor: there the total is the modelled sum,
labelled ``"modelled"``, with a note saying why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hetsched
from hetsched import Adaptation, Runtime, Session
from hetsched._platform.telemetry import Telemetry
from hetsched._runtime._clock import VirtualClock

from _models import conv_relu_cnn

pytestmark = pytest.mark.anyio


def _set_vdd_in(root: Path, mv: int, ma: int) -> None:
    rail = next(r for r in Telemetry(root).platform.rails if r.name == "VDD_IN")
    assert rail.voltage_path is not None and rail.current_path is not None
    (root / rail.voltage_path).write_text(f"{mv}\n")
    (root / rail.current_path).write_text(f"{ma}\n")


async def test_the_boards_energy_is_its_measured_rail_on_the_orin_twin_split_by_busy_share(
        tmp_path: Path, anyio_backend: str) -> None:
    hetsched.LiveTwin("orin-nx", tmp_path, noise=False).write_once()
    _set_vdd_in(tmp_path, 5000, 2000)  # 10 W, whatever runs: the rail's figure, not the stages'
    clock = VirtualClock()
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    no_replan = Adaptation(replanning=None)
    async with Runtime(root=tmp_path, devices=["gpu"], clock=clock, replacement=None) as rt:
        async with Session(conv_relu_cnn(), runtime=rt, adaptation=no_replan, name="a") as a, \
                   Session(conv_relu_cnn(), runtime=rt, adaptation=no_replan, name="b") as b:
            for _ in range(6):
                await a.run({"x": x})
            for _ in range(2):
                await b.run({"x": x})
            clock.advance(1.5)
            st = rt.statistics()
            assert st.energy_source == "measured: VDD_IN" and st.energy_note is None
            assert st.energy_j == pytest.approx(15.0)  # 10 W x 1.5 s since the runtime opened
            ea, eb = a.statistics().energy_j, b.statistics().energy_j
            assert ea is not None and eb is not None
            assert st.stage_energy_j == pytest.approx(ea + eb)
            assert st.stage_energy_j is not None and st.energy_j is not None
            assert st.stage_energy_j < st.energy_j  # the board draws for more than the stages
            shares = {s.name: s.busy_share for s in st.sessions}
            assert shares["a"] > shares["b"] > 0
            assert st.energy_split_j == pytest.approx({"a": 15.0 * shares["a"], "b": 15.0 * shares["b"]})
            assert sum(st.energy_split_j.values()) == pytest.approx(15.0)
            _set_vdd_in(tmp_path, 5000, 1000)  # 5 W from here on
            clock.advance(2.0)
        clock.advance(1.0)  # closing reads the rail once more: 5 W x 1 s
    clock.advance(10.0)  # after the close: nothing more is counted
    assert rt.statistics().energy_j == pytest.approx(15.0 + 5.0 * 3.0)


async def test_the_rk3588_has_no_power_monitor_so_the_total_stays_the_modelled_sum(
        tmp_path: Path, anyio_backend: str) -> None:
    hetsched.LiveTwin("rk3588", tmp_path, noise=False).write_once()
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    async with Runtime(root=tmp_path, devices=["gpu"], replacement=None) as rt:
        async with Session(conv_relu_cnn(), runtime=rt, adaptation=Adaptation(replanning=None), name="a") as a:
            await a.run({"x": x})
            ea = a.statistics().energy_j
        st = rt.statistics()
    assert st.energy_source == "modelled"
    assert ea is not None and st.energy_j == pytest.approx(ea) == pytest.approx(st.stage_energy_j)
    assert st.energy_note is not None and "no measured board-input rail" in st.energy_note
