"""The board sees the session and the session sees the board (issue 12): a live twin's loads follow
the session's modelled work (loads, power, energy), energy is reported, and a device heating up re-places the plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import hetsched
from hetsched import EventInfo, Hooks, LiveTwin, Replanning, Session
from hetsched.backends.sim import clock_from_root, twin_devices
from hetsched.testing import FakeBackend, build_board_tree, fake_device

from _models import conv_relu_cnn


class _Energy(Hooks):
    def __init__(self) -> None:
        self.stage: list[float | None] = []
        self.request: list[float | None] = []
        self.replans: list[Any] = []

    def after_stage(self, info: EventInfo) -> None:
        self.stage.append(info.energy_j)

    def request_end(self, info: EventInfo) -> None:
        self.request.append(info.energy_j)

    def replan(self, info: EventInfo) -> None:
        self.replans.append(info.extra)


def _gpu_load(root: Path) -> int:
    """The GPU devfreq load the RK3588 tree shows (``load`` is ``<percent>@<Hz>``)."""
    for load in root.glob("sys/class/devfreq/*gpu*/load"):
        return int(load.read_text().split("@")[0])
    raise AssertionError("no GPU devfreq load file in the tree")


@pytest.mark.anyio
async def test_a_live_twin_shows_the_sessions_load_heat_and_energy(tmp_path: Path, anyio_backend: str) -> None:
    twin = LiveTwin("rk3588", tmp_path, noise=False)
    twin.advance(0.0)
    idle = LiveTwin("rk3588", tmp_path / "idle", noise=False)
    idle.advance(0.0)
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    rec = _Energy()
    total = 0.0
    # one plan throughout (no re-plan on drift), so each stage's figures add up to the session's
    async with Session(conv_relu_cnn(), root=tmp_path, devices=["gpu"], hooks=[rec], adaptation=hetsched.Adaptation(replanning=None)) as s:
        assert [d.name for d in s.devices] == ["gpu"]
        for _ in range(20):  # board time driven by the work: each batch advances the twin by its busy time
            for _ in range(20):
                await s.run({"x": x})
            busy = s.statistics().device_busy_s["gpu"] - total
            assert busy > 0
            total += busy
            twin.advance(busy)
            idle.advance(busy)
        stats = s.statistics()
    assert twin.statistics().reported_busy_s["gpu"] == pytest.approx(total, rel=1e-6)
    assert _gpu_load(tmp_path) >= 90  # busy the whole time the board advanced
    assert _gpu_load(tmp_path / "idle") == 0
    # the GPU drew its busy power over that time (the heat that follows over seconds of board
    # time is tests/test_twin_load.py's; this model's work adds up to milliseconds)
    assert twin.sim.power("gpu") > idle.sim.power("gpu")
    assert twin.statistics().energy_j > idle.statistics().energy_j
    # energy: the session's figure, per stage run and per request
    assert stats.energy_source == "modelled"
    assert stats.energy_j is not None and stats.energy_j > 0
    assert sum(stats.stage_energy_j.values()) == pytest.approx(stats.energy_j)
    assert len(rec.stage) == 400 and all(e is not None and e > 0 for e in rec.stage)
    assert sum(e for e in rec.stage if e) == pytest.approx(stats.energy_j)
    assert rec.request == rec.stage  # one stage per request: the request's energy is its stage's


@pytest.mark.anyio
async def test_a_session_on_the_host_reports_no_energy(anyio_backend: str) -> None:
    async with Session(conv_relu_cnn(), devices=["cpu"]) as s:
        await s.run({"x": np.zeros((1, 3, 32, 32), np.float32)})
        stats = s.statistics()
    assert stats.energy_j is None and stats.energy_source is None
    assert dict(stats.device_busy_s) == {}


def _set_zone(root: Path, zone_type: str, millic: int) -> None:
    for zone in root.glob("sys/class/thermal/thermal_zone*"):
        if (zone / "type").read_text().strip() == zone_type:
            (zone / "temp").write_text(f"{millic}\n")
            return
    raise AssertionError(f"no zone {zone_type!r}")


@pytest.mark.anyio
async def test_a_device_heating_past_its_trip_re_places_its_work(tmp_path: Path, anyio_backend: str) -> None:
    build_board_tree(tmp_path, "rk3588")
    rec = _Energy()
    with FakeBackend("fake-hot"):
        # two equally fast accelerators: the GPU and the NPU, each read against its own zone
        devices = [dataclasses.replace(fake_device(name, backend="fake-hot", kind=name), domain=name)
                   for name in ("gpu", "npu")]
        config = Replanning(period_s=0.02, min_interval_s=0.0)
        async with Session(conv_relu_cnn(), root=tmp_path, devices=devices, hooks=[rec], adaptation=hetsched.Adaptation(replanning=config)) as s:
            first = {st.device for st in s.plan.stages}
            assert len(first) == 1
            hot = first.pop()
            other = "npu" if hot == "gpu" else "gpu"
            assert s.plan.device_states[hot].temp_headroom > 0.5
            _set_zone(tmp_path, f"{hot}-thermal", 95_000)  # far above the board's 75 C passive trip
            with anyio.fail_after(30):
                while not rec.replans:
                    await s.run({"x": np.zeros((1, 3, 32, 32), np.float32)})
                    await anyio.sleep(0.01)
            assert rec.replans[0].reason.startswith("thermal")
            assert hot in rec.replans[0].reason
            assert {st.device for st in s.plan.stages} == {other}
            assert s.plan.device_states[hot].temp_headroom == 0.0
            assert s.plan.to_json()["device_states"][hot]["temp_headroom"] == 0.0
            # cooling down again: hysteresis lets the work come back, with a second re-plan
            _set_zone(tmp_path, f"{hot}-thermal", 40_000)
            with anyio.fail_after(30):
                while len(rec.replans) < 2:
                    await s.run({"x": np.zeros((1, 3, 32, 32), np.float32)})
                    await anyio.sleep(0.01)
            assert "back above" in rec.replans[1].reason
            assert s.statistics().replanning.reasons["thermal"] == 2


def test_twin_devices_carry_their_root_for_the_load_channel(tmp_path: Path) -> None:
    devices = twin_devices("rk3588", clock=clock_from_root(str(build_board_tree(tmp_path, "rk3588"))),
                           root=str(tmp_path))
    assert all(d.options["root"] == str(tmp_path) for d in devices)
    assert all(d.options["root"] is None for d in twin_devices("rk3588"))


@pytest.mark.anyio
async def test_energy_and_busy_time_span_re_plans(tmp_path: Path, anyio_backend: str) -> None:
    build_board_tree(tmp_path, "rk3588")
    rec = _Energy()
    x = np.zeros((1, 3, 32, 32), np.float32)
    async with Session(conv_relu_cnn(), root=tmp_path, devices=["gpu", "big"],
                       hooks=[rec], adaptation=hetsched.Adaptation(replanning=Replanning(period_s=60.0))) as s:
        for k in range(3):
            for _ in range(30):
                await s.run({"x": x})
            await s.replan(reason=f"test {k}")
        for _ in range(30):
            await s.run({"x": x})
        stats = s.statistics()
        assert stats.replanning.replans == 3
    assert len(rec.stage) == 120
    assert stats.energy_j == pytest.approx(sum(e for e in rec.stage if e))
    assert sum(stats.device_busy_s.values()) > 0
