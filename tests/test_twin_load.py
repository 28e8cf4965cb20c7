"""The live twin sees the session: simulated stages report modelled busy time through the root."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from hetsched import TwinError
from hetsched._platform.telemetry import Telemetry
from hetsched._twin.live import LiveTwin
from hetsched._twin.loadfile import CHANNEL_DIR, LoadChannel, LoadReporter
from hetsched.testing import build_board_tree

RK_GPU = "sys/class/devfreq/fb000000.gpu"
PERIOD = 0.1  # board seconds per advance()


def _channel(root: Path) -> Path:
    return root.joinpath(*CHANNEL_DIR)


def _zone_temp(root: Path, ztype: str) -> int:
    for z in sorted((root / "sys/class/thermal").glob("thermal_zone*")):
        if (z / "type").read_text().strip() == ztype:
            return int((z / "temp").read_text())
    raise AssertionError(f"no zone {ztype}")


def _tree_listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _dead_pid() -> int:
    # The kernel never hands out pid_max itself (pids are < pid_max): a writer that cannot be alive.
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def _run_periods(twin: LiveTwin, rep: LoadReporter | None, domain: str, busy: float, periods: int) -> None:
    for _ in range(periods):
        if rep is not None:
            rep.report(domain, busy / 2)
            rep.report(domain, busy / 2)
        twin.advance(PERIOD)


def _twins(tmp_path: Path, soc: str) -> tuple[LiveTwin, LiveTwin]:
    idle = LiveTwin(soc, tmp_path / "idle", noise=False)
    busy = LiveTwin(soc, tmp_path / "busy", noise=False)
    for t in (idle, busy):
        t.advance(0.0)  # materialise; a driven twin opens its load channel
    return idle, busy


def test_rk3588_gpu_follows_reported_work(tmp_path: Path) -> None:
    idle, busy = _twins(tmp_path, "rk3588")
    rep = LoadReporter.for_root(busy.root)
    assert rep is not None
    with rep:
        _run_periods(idle, None, "gpu", 0.0, 100)
        _run_periods(busy, rep, "gpu", 0.08, 100)
    load = (busy.root / RK_GPU / "load").read_text()
    pct, hz = load.strip().split("@")
    assert int(pct) == 80, load  # 0.08 busy board-s in each 0.1 board-s period
    assert (idle.root / RK_GPU / "load").read_text().startswith("0@")
    # simple_ondemand raised the clock for the load; the idle GPU stays at its lowest.
    assert int(hz.removesuffix("Hz")) > int((idle.root / RK_GPU / "cur_freq").read_text())
    assert _zone_temp(busy.root, "gpu-thermal") > _zone_temp(idle.root, "gpu-thermal")
    sb, si = busy.statistics(), idle.statistics()
    assert sb.energy_j > si.energy_j
    assert sb.reported_busy_s["gpu"] == pytest.approx(8.0)
    assert si.reported_busy_s == {}
    assert sb.load_channel is not None and sb.load_channel.lines == 200
    assert busy.sim.power("gpu") > idle.sim.power("gpu")


def test_orin_gpu_load_and_measured_rails_follow_reported_work(tmp_path: Path) -> None:
    idle, busy = _twins(tmp_path, "orin-nx")
    rep = LoadReporter.for_root(busy.root)
    assert rep is not None
    with rep:
        _run_periods(idle, None, "gpu", 0.0, 50)
        _run_periods(busy, rep, "gpu", 0.05, 50)
    gpu = "sys/devices/platform/bus@0/17000000.gpu"
    assert (busy.root / gpu / "load").read_text() == "500\n"  # per-mille
    assert (idle.root / gpu / "load").read_text() == "0\n"
    rails_b = {r.name: r.power_w for r in Telemetry(busy.root).sample_once().rails.values()}
    rails_i = {r.name: r.power_w for r in Telemetry(idle.root).sample_once().rails.values()}
    assert rails_b.keys() == rails_i.keys() and rails_b
    name = next(n for n in rails_b if "IN" in n)
    b, i = rails_b[name], rails_i[name]
    assert b is not None and i is not None and b > i


def test_background_utilisation_adds_and_the_sum_is_capped(tmp_path: Path) -> None:
    twin = LiveTwin("rk3588", tmp_path, noise=False)
    twin.advance(0.0)
    twin.report_utilisation("npu", 0.3)
    rep = LoadReporter.for_root(twin.root)
    assert rep is not None
    rep.report("npu", 0.04)
    twin.advance(0.0)  # no time passed: the report waits for the next period
    assert twin.sim.utilisation("npu") == pytest.approx(0.3)
    twin.advance(PERIOD)
    assert twin.sim.utilisation("npu") == pytest.approx(0.7)
    rep.report("npu", 0.5)  # more than the period: several workers, or a fast host
    twin.advance(PERIOD)
    assert twin.sim.utilisation("npu") == 1.0
    twin.advance(PERIOD)  # nothing reported: back to the background load
    assert twin.sim.utilisation("npu") == pytest.approx(0.3)
    rep.report("npu", 0.02)
    twin.advance(PERIOD)
    twin.report_utilisation("npu", 0.0)  # the session's share stays until the next period
    assert twin.sim.utilisation("npu") == pytest.approx(0.2)
    rep.report("nope", 1.0)  # a domain the board does not have is not counted
    twin.advance(PERIOD)
    assert "nope" not in twin.statistics().reported_busy_s
    assert twin.statistics().reported_busy_s["npu"] == pytest.approx(0.56)
    rep.close()


def _child(root: str, busy: float, n: int) -> None:
    rep = LoadReporter.for_root(root)
    assert rep is not None
    with rep:
        for _ in range(n):
            rep.report("gpu", busy)


def test_reports_from_two_processes_are_both_counted(tmp_path: Path) -> None:
    twin = LiveTwin("rk3588", tmp_path, noise=False)
    twin.advance(0.0)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_child, args=(str(twin.root), b, 10)) for b in (0.001, 0.004)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    twin.advance(1.0)
    s = twin.statistics()
    assert s.reported_busy_s["gpu"] == pytest.approx(0.05)
    assert twin.sim.utilisation("gpu") == pytest.approx(0.05)
    assert s.load_channel is not None
    assert s.load_channel.files_removed == 2 and s.load_channel.writers == 0
    assert os.listdir(_channel(twin.root)) == []


def test_partial_last_line_waits_for_a_live_writer_and_is_ignored_from_a_dead_one(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    ch = LoadChannel.create(root)
    d = _channel(root)
    live = d / f"{os.getpid()}-00000000aaaaaaaa-0.load"
    dead = d / f"{_dead_pid()}-00000000bbbbbbbb-0.load"
    live.write_bytes(b"gpu 0.25\ngpu 0.")
    dead.write_bytes(b"npu 0.125\nnpu 0.5")
    assert ch.read() == {"gpu": 0.25, "npu": 0.125}
    assert live.exists() and not dead.exists()
    with open(live, "ab") as f:
        f.write(b"5\n")
    assert ch.read() == {"gpu": 0.5}
    s = ch.statistics()
    assert s.partial_lines == 1 and s.files_removed == 1 and s.writers == 1 and s.lines == 3
    with open(live, "ab") as f:
        f.write(b"gpu -1\ngpu nan\ngpu\ngpu 1 2\n\xff 1\ngpu 0.5\n.end\ngpu 9\n")
    assert ch.read() == {"gpu": 0.5}  # malformed lines skipped; nothing after the end marker
    assert not live.exists()
    assert ch.statistics().malformed == 5
    assert ch.statistics().busy_s == {"gpu": 1.25, "npu": 0.125}


def test_channel_created_at_start_skips_what_was_already_there(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    first = LoadChannel.create(root)
    rep = LoadReporter.for_root(root)
    assert rep is not None
    rep.report("gpu", 3.0)  # written while no twin read it
    second = LoadChannel.create(root)
    assert second.read() == {}
    rep.report("gpu", 0.5)
    assert second.read() == {"gpu": 0.5}
    assert first.read() == {"gpu": 3.5}
    rep.close()


def test_rotation_keeps_files_small_and_loses_nothing(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    ch = LoadChannel.create(root)
    rep = LoadReporter.for_root(root, rotate_bytes=64)
    assert rep is not None
    for _ in range(40):
        rep.report("cluster4", 0.125)
    assert ch.read() == {"cluster4": 5.0}
    st = rep.statistics()
    assert st.files > 5 and st.reports == 40 and st.dropped == 0
    assert len(os.listdir(_channel(root))) == 1  # the ended files were deleted once read
    rep.close()
    rep.report("cluster4", 1.0)
    assert rep.statistics().dropped == 1
    assert ch.read() == {}
    assert os.listdir(_channel(root)) == []


def test_no_channel_on_a_plain_or_snapshot_root(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert LoadReporter.for_root(plain) is None
    assert LoadReporter.for_root(tmp_path / "missing") is None
    board = build_board_tree(tmp_path / "board", "rk3588")
    before = _tree_listing(board)
    assert LoadReporter.for_root(board) is None
    snap = LiveTwin("orin-nx", tmp_path / "snap")
    snap.write_once()  # `hetsched twin --once`: nobody would read a channel
    assert LoadReporter.for_root(snap.root) is None
    assert _tree_listing(board) == before and os.listdir(plain) == []
    assert not _channel(snap.root).parent.exists()


def test_symlinked_channel_is_refused(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path / "root", "rk3588")
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / CHANNEL_DIR[0]).mkdir()
    os.symlink(outside, _channel(root))
    with pytest.raises(TwinError, match="symlink"):
        LoadReporter.for_root(root)
    with pytest.raises(TwinError, match="symlink"):
        LoadChannel.create(root)
    with pytest.raises(TwinError, match="symlink"):
        LiveTwin("rk3588", root).advance(0.0)
    assert os.listdir(outside) == []


def test_a_link_inside_the_channel_is_not_followed(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path / "root", "rk3588")
    ch = LoadChannel.create(root)
    secret = tmp_path / "secret"
    secret.write_text("gpu 100\n")
    os.symlink(secret, _channel(root) / f"{os.getpid()}-00000000cccccccc-0.load")
    os.mkfifo(_channel(root) / f"{os.getpid()}-00000000dddddddd-0.load")
    (_channel(root) / "stray.txt").write_text("gpu 1\n")
    assert ch.read() == {}
    assert ch.statistics().refused == 3
    assert secret.read_text() == "gpu 100\n"
    # Swapped for a link while the twin runs: the twin reads nothing and goes on.
    ch.remove()
    (root / CHANNEL_DIR[0]).mkdir()
    os.symlink(tmp_path, _channel(root))
    assert ch.read() == {}


def test_report_rejects_bad_input(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    LoadChannel.create(root)
    rep = LoadReporter.for_root(root)
    assert rep is not None
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(TwinError, match="busy seconds"):
            rep.report("gpu", bad)
    for name in ("", "g pu", "gpu\n1", "x" * 65):
        with pytest.raises(TwinError, match="domain"):
            rep.report(name, 1.0)
    rep.report("gpu", 0.0)  # nothing to say: nothing written
    assert rep.statistics().reports == 0
    with pytest.raises(TwinError, match="rotate_bytes"):
        LoadReporter.for_root(root, rotate_bytes=0)
    rep.close()
    rep.close()


@pytest.mark.anyio
async def test_running_twin_owns_the_channel(tmp_path: Path) -> None:
    twin = LiveTwin("rk3588", tmp_path, noise=False, period_s=3600.0)
    assert LoadReporter.for_root(tmp_path) is None
    async with twin:
        rep = LoadReporter.for_root(twin.root)
        assert rep is not None
        rep.report("gpu", 0.05)
        twin.advance(PERIOD)
        assert twin.statistics().reported_busy_s["gpu"] == pytest.approx(0.05)
        assert (twin.root / RK_GPU / "load").read_text().startswith("50@")
    assert not _channel(twin.root).parent.exists()
    assert LoadReporter.for_root(twin.root) is None
    rep.report("gpu", 0.05)  # the twin is gone: written into its deleted file, harmless
    rep.close()
    stopped = twin.statistics().load_channel
    assert stopped is not None and stopped.lines == 1
    async with twin:  # entered again: a fresh channel that sees new writers
        again = LoadReporter.for_root(twin.root)
        assert again is not None
        again.report("gpu", 0.02)
        twin.advance(PERIOD)
        assert twin.statistics().reported_busy_s["gpu"] == pytest.approx(0.07)
        again.close()
