"""Contention on the twin (issue 26): one device shared in time, DRAM shared between devices."""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hetsched import TwinError
from hetsched._twin.contention import BoardContention, shared_board


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_lone_run_keeps_its_roofline_time() -> None:
    clock = ManualClock()
    board = BoardContention(clock)
    token = board.begin("npu", 0.010, 0.004)
    clock.now = 0.010
    run = board.end(token)
    assert run.latency_s == pytest.approx(0.010) and run.busy_s == pytest.approx(0.010)
    assert run.device_share == 1.0 and run.memory_stretch == 1.0


def test_two_sessions_on_one_device_each_time_grows_and_the_busy_times_sum_to_the_device() -> None:
    clock = ManualClock()
    board = BoardContention(clock)
    a = board.begin("npu", 0.010)  # session A's stage
    b = board.begin("npu", 0.010)  # session B's, at once
    clock.now = 0.020  # processor sharing: both progress at half rate, both end at 20 ms
    ra, rb = board.end(a), board.end(b)
    for r in (ra, rb):
        assert r.latency_s == pytest.approx(0.020) and r.latency_s > r.alone_s
        assert r.device_share == pytest.approx(2.0)
    stats = board.statistics()
    # the device was busy 20 ms (the union of the two intervals): the sum of the runs' own times
    assert ra.busy_s + rb.busy_s == pytest.approx(0.020) == stats.busy_s["npu"]
    assert stats.shared_runs == 2 and stats.in_flight == 0


def test_partial_overlap_stretches_only_the_shared_part() -> None:
    clock = ManualClock()
    board = BoardContention(clock)
    # the runs' factors are their averages over their own intervals on the clock
    a = board.begin("npu", 0.010)
    clock.now = 0.005  # A alone for 5 ms
    b = board.begin("npu", 0.010)
    clock.now = 0.015  # A and B together for 10 ms
    ra = board.end(a)
    clock.now = 0.020  # B alone again for 5 ms
    rb = board.end(b)
    assert ra.device_share == pytest.approx((5 * 1 + 10 * 2) / 15)
    assert ra.latency_s == pytest.approx(0.010 * ra.device_share)
    assert rb.device_share == pytest.approx((10 * 2 + 5 * 1) / 15)
    assert ra.busy_s + rb.busy_s == pytest.approx(0.020)  # busy from 0 to 20 ms


def test_devices_on_different_domains_share_only_the_memory_bandwidth() -> None:
    clock = ManualClock()
    board = BoardContention(clock)
    npu = board.begin("npu", 0.010, 0.008)  # demands 80 % of DRAM's peak
    gpu = board.begin("gpu", 0.010, 0.008)  # 80 %: together 160 %, saturated
    cpu = board.begin("cluster4", 0.010, 0.0)  # compute-bound: no memory-bound part to stretch
    clock.now = 0.010
    rn, rg, rc = board.end(npu), board.end(gpu), board.end(cpu)
    stretch = 1 + 0.8 * (1.6 - 1)
    for r in (rn, rg):
        assert r.device_share == 1.0
        assert r.memory_stretch == pytest.approx(stretch)
        assert r.latency_s == pytest.approx(0.010 * stretch) == r.busy_s  # the stall keeps the device busy
        assert r.memory_s == pytest.approx(0.008 * stretch)
    assert rc.latency_s == pytest.approx(0.010)
    assert board.statistics().stretched_runs == 2


def test_memory_below_saturation_costs_nothing() -> None:
    clock = ManualClock()
    board = BoardContention(clock)
    a, b = board.begin("npu", 0.010, 0.004), board.begin("gpu", 0.010, 0.005)  # 90 % together
    clock.now = 0.010
    assert board.end(a).latency_s == pytest.approx(0.010)
    assert board.end(b).latency_s == pytest.approx(0.010)


def test_a_virtual_clock_not_advanced_uses_the_state_at_the_end() -> None:
    board = BoardContention(ManualClock())
    a, b = board.begin("npu", 0.010), board.begin("npu", 0.010)
    assert board.end(a).latency_s == pytest.approx(0.020)
    assert board.end(b).latency_s == pytest.approx(0.010)  # alone by then


def test_misuse_is_a_twin_error() -> None:
    board = BoardContention(ManualClock())
    token = board.begin("npu", 0.01)
    board.end(token)
    with pytest.raises(TwinError, match="twice"):
        board.end(token)
    with pytest.raises(TwinError, match="on another board"):
        BoardContention(ManualClock()).end(board.begin("npu", 0.01))
    for bad in (-1.0, float("nan"), float("inf"), True):
        with pytest.raises(TwinError, match="alone_s"):
            board.begin("npu", bad)
    with pytest.raises(TwinError, match="exceeds"):
        board.begin("npu", 0.01, 0.02)


def test_shared_board_is_one_per_key() -> None:
    assert shared_board("soc:test-a") is shared_board("soc:test-a")
    assert shared_board("soc:test-a") is not shared_board("soc:test-b")


# ---- through the twin's simulated stages (backends/sim.py): two sessions' stages at once


class _BlockingInner:
    """An inner stage that returns once the test lets it (so two runs are in flight at once)."""

    def __init__(self, go: threading.Event) -> None:
        from hetsched.backends import NO_STAGE_HOOKS

        self.input_names: tuple[str, ...] = ("x",)
        self.output_names: tuple[str, ...] = ("y",)
        self.hooks = NO_STAGE_HOOKS
        self.go = go

    def run(self, feeds: Any) -> list[Any]:
        assert self.go.wait(10)
        return [feeds["x"]]

    def close(self) -> None:
        pass


def _stages(tmp_path: Path, names: tuple[str, ...], flops: float, nbytes: float
            ) -> tuple[ManualClock, BoardContention, list[Any], threading.Event]:
    from hetsched.backends.sim import SimStage, twin_devices

    clock = ManualClock()
    board = shared_board(str(tmp_path), clock=clock)
    devices = {d.name: d for d in twin_devices("rk3588", root=str(tmp_path))}
    go = threading.Event()
    return clock, board, [SimStage(_BlockingInner(go), f"s{i}", devices[n], flops, nbytes)
                          for i, n in enumerate(names)], go


def _run_together(clock: ManualClock, board: BoardContention, stages: list[Any], go: threading.Event) -> None:
    x = np.zeros(4, np.float32)
    threads = [threading.Thread(target=s.run, args=({"x": x},)) for s in stages]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while board.statistics().in_flight < len(stages):
        assert time.monotonic() < deadline, "the stages never ran at once"
        time.sleep(0.001)
    clock.now += 1.0
    go.set()
    for t in threads:
        t.join(10)


def test_two_sessions_stages_on_one_twin_device_share_it(tmp_path: Path) -> None:
    clock, board, (a, b), go = _stages(tmp_path, ("npu", "npu"), 2e9, 1e6)
    alone = a.modelled()[0]
    _run_together(clock, board, [a, b], go)
    for s in (a, b):
        st = s.statistics()
        assert st.modelled_time_s == pytest.approx(2 * alone)  # each one's modelled time grows
        assert st.busy_time_s == pytest.approx(alone)
    # the device's busy time is the sum of the two stages' own
    assert board.statistics().busy_s["npu"] == pytest.approx(a.statistics().busy_time_s + b.statistics().busy_time_s)
    # alone again: the lone roofline figure
    a.run({"x": np.zeros(4, np.float32)})
    assert a.statistics().last_modelled_s == pytest.approx(alone)


def test_memory_bound_stages_on_two_twin_devices_share_the_bandwidth(tmp_path: Path) -> None:
    clock, board, (npu, gpu), go = _stages(tmp_path, ("npu", "gpu"), 1e3, 5e8)  # memory-bound on both
    alone = {s.device.name: s.modelled() for s in (npu, gpu)}
    _run_together(clock, board, [npu, gpu], go)
    for s in (npu, gpu):
        st = s.statistics()
        t, e = alone[s.device.name]
        assert st.modelled_time_s == pytest.approx(2 * t, rel=1e-3)  # both demand all of DRAM: half each
        assert st.busy_time_s == pytest.approx(st.modelled_time_s)  # the stall keeps the device busy
        assert st.modelled_energy_j == pytest.approx(2 * e, rel=1e-3)


def test_a_board_no_stage_uses_is_not_kept() -> None:
    import gc

    board = shared_board("soc:test-gone")
    ref = weakref.ref(board)
    del board
    gc.collect()
    assert ref() is None


def test_the_live_twin_is_told_the_sum_of_the_busy_times_not_the_latencies(tmp_path: Path) -> None:
    # the board's load (and so its clocks, heat and energy) follows the device's busy time: two
    # stages sharing the NPU report their own times, which sum to the device's, not 2 x 2 x alone
    from hetsched._twin.loadfile import LoadChannel

    channel = LoadChannel.create(tmp_path)
    clock, board, (a, b), go = _stages(tmp_path, ("npu", "npu"), 2e9, 1e6)
    alone = a.modelled()[0]
    _run_together(clock, board, [a, b], go)
    for s in (a, b):
        s.close()  # ends the reporter's file
    busy = channel.read()
    assert busy["npu"] == pytest.approx(2 * alone)
    assert a.statistics().modelled_time_s + b.statistics().modelled_time_s == pytest.approx(4 * alone)
    channel.remove()


# ---- pacing (the sim backend's paced mode): a run held in flight for K x its modelled time


class _PacingClock:
    """A virtual clock the board's pacing wait advances (no host sleep): each wait moves it by the
    time the waiter asked for, or less when the test's ``cap`` cuts it (another run starts meanwhile)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []
        self.on_wait: list[Any] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, cond: threading.Condition, seconds: float) -> None:
        self.waits.append(seconds)
        if self.on_wait:
            step, action = self.on_wait.pop(0)
            self.now += min(step, seconds)
            cond.release()  # as cond.wait does: another thread's begin/end gets the board meanwhile
            try:
                action()
            finally:
                cond.acquire()
        else:
            self.now += seconds


def test_a_paced_run_takes_k_times_its_modelled_time() -> None:
    clock = _PacingClock()
    board = BoardContention(clock, clock.wait)
    token = board.begin("npu", 0.010, 0.004)
    board.pace(token, 0.010 * 7)  # K = 7
    assert clock.now == pytest.approx(0.070)
    run = board.end(token)
    assert run.latency_s == pytest.approx(0.010)  # its modelled (board) time is unchanged


def test_two_paced_runs_on_one_device_each_take_twice_as_long() -> None:
    clock = _PacingClock()
    board = BoardContention(clock, clock.wait)
    a = board.begin("npu", 0.010)
    b = board.begin("npu", 0.010)
    board.pace(a, 0.010 * 5)  # K = 5: half rate while b is in flight -> 2 x 5 x 10 ms
    assert clock.now == pytest.approx(0.100)
    board.pace(b, 0.010 * 5)  # b progressed as much: nothing left to wait
    assert clock.now == pytest.approx(0.100)
    assert board.end(a).latency_s == pytest.approx(0.020) == board.end(b).latency_s


def test_a_paced_run_recomputes_its_end_when_another_starts() -> None:
    clock = _PacingClock()
    board = BoardContention(clock, clock.wait)
    a = board.begin("npu", 0.010)
    later: list[Any] = []
    # a waits for its whole 40 ms (K = 4); 20 ms in, b starts on the same device (the wait is woken early)
    clock.on_wait.append((0.020, lambda: later.append(board.begin("npu", 1.0))))
    board.pace(a, 0.040)
    # 20 ms alone (half of a's work), the other half at half rate: 40 ms more
    assert clock.now == pytest.approx(0.060)
    assert clock.waits[0] == pytest.approx(0.040) and clock.waits[1] == pytest.approx(0.040)
    board.end(later[0])


def test_memory_bound_paced_runs_on_two_devices_stretch() -> None:
    clock = _PacingClock()
    board = BoardContention(clock, clock.wait)
    npu = board.begin("npu", 0.010, 0.010)
    gpu = board.begin("gpu", 0.010, 0.010)  # both want all of DRAM: each at half rate
    board.pace(npu, 0.010 * 3)
    assert clock.now == pytest.approx(0.060)
    board.end(npu)
    board.end(gpu)


def test_pacing_misuse_is_a_twin_error() -> None:
    clock = _PacingClock()
    board = BoardContention(clock, clock.wait)
    token = board.begin("npu", 0.010)
    with pytest.raises(TwinError, match="work_s"):
        board.pace(token, -1.0)
    board.end(token)
    with pytest.raises(TwinError, match="not in flight"):
        board.pace(token, 0.01)
    kept = shared_board("soc:test-pace", wait=clock.wait)
    with pytest.raises(TwinError, match="already exists"):
        shared_board("soc:test-pace", wait=clock.wait)  # a board keeps the wait it was made with
    assert shared_board("soc:test-pace") is kept
