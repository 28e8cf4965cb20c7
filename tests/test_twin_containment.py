"""The twin writes, creates, renames and deletes only inside its root (issue 13, containment).

Each test plants a symlink in a twin tree that leads outside it, runs the twin (the library,
the live twin or ``hetsched twin --once``), and checks that the directory outside is exactly as
it was: same listing, modes, sizes, mtimes, link targets and content hashes. Links that stay
inside the root are still followed, as sysfs's own are. Also the dma-heap probe of the buffer
pools: a heap that links out of the root, or is not a character device, is never opened.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from hetsched import PathOutsideRootError, PlatformError, SysfsRoot, TwinError
from hetsched._cli import main
from hetsched._runtime._pool import BufferPool
from hetsched._twin.live import LiveTwin
from hetsched._twin.loadfile import LoadChannel

ZONE0 = "sys/devices/virtual/thermal/thermal_zone0"
POLICY0 = "sys/devices/system/cpu/cpufreq/policy0"


def snapshot(top: Path) -> dict[str, tuple[object, ...]]:
    """Everything observable about a directory tree, without following links."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            rel = str(p.relative_to(top))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_mode, st.st_mtime_ns)
            else:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                out[rel] = ("file", st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the twin root holding files a runaway twin would clobber."""
    d = tmp_path / "outside"
    (d / "schedutil").mkdir(parents=True)
    (d / "temp").write_text("precious\n")
    (d / "online").write_text("do not touch\n")
    (d / "set_freq").write_text("42\n")
    (d / "up_threshold").write_text("keep me\n")
    (d / "rate_limit_us").write_text("keep me too\n")
    (d / "schedutil" / "rate_limit_us").write_text("nested\n")
    return d


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A materialised rk3588 twin tree (the snapshot `hetsched twin --once` writes)."""
    r = tmp_path / "root"
    LiveTwin("rk3588", r, seed=1).write_once()
    return r


def replace_with_link(path: Path, target: str | Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        for dirpath, dirnames, filenames in os.walk(path, topdown=False):
            for f in filenames:
                os.unlink(os.path.join(dirpath, f))
            for d in dirnames:
                p = os.path.join(dirpath, d)
                os.unlink(p) if os.path.islink(p) else os.rmdir(p)
        path.rmdir()
    os.symlink(target, path)


# -- the library: BoardTree via LiveTwin.write_once / advance ------------------------------------


def test_planted_file_link_out_of_the_root_is_refused(root: Path, outside: Path) -> None:
    replace_with_link(root / ZONE0 / "temp", outside / "temp")
    before = snapshot(outside)
    with pytest.raises(PathOutsideRootError, match=r"thermal_zone0/temp"):
        LiveTwin("rk3588", root, seed=1).write_once()
    assert snapshot(outside) == before
    assert os.readlink(root / ZONE0 / "temp") == str(outside / "temp")  # refused, not replaced


def test_planted_temp_file_link_is_replaced_not_written_through(root: Path, outside: Path) -> None:
    # put() writes ".<name>.twin-tmp" then renames it: a link planted at that name must not be
    # opened (the old code truncated and filled the file it pointed at).
    os.symlink(outside / "temp", root / ZONE0 / ".temp.twin-tmp")
    before = snapshot(outside)
    twin = LiveTwin("rk3588", root, seed=1)
    twin.write_once()
    assert snapshot(outside) == before
    temp = root / ZONE0 / "temp"
    assert not temp.is_symlink() and int(temp.read_text()) > 0
    assert not (root / ZONE0 / ".temp.twin-tmp").exists()


def test_planted_directory_link_out_of_the_root_is_refused(root: Path, outside: Path) -> None:
    replace_with_link(root / "sys/devices/system/cpu", outside)
    before = snapshot(outside)
    with pytest.raises(PathOutsideRootError, match=r"sys/devices/system/cpu.*outside the twin root"):
        LiveTwin("rk3588", root, seed=1).write_once()
    assert snapshot(outside) == before


def test_relative_link_in_a_parent_directory_climbing_out_is_refused(root: Path, outside: Path) -> None:
    # <root>/sys/devices/virtual -> ../../../outside: every thermal zone lies below it.
    replace_with_link(root / "sys/devices/virtual", "../../../outside")
    assert (root / "sys/devices/virtual").resolve() == outside.resolve()
    before = snapshot(outside)
    with pytest.raises(PathOutsideRootError, match="outside the twin root"):
        LiveTwin("rk3588", root, seed=1).write_once()
    assert snapshot(outside) == before


def test_a_governor_directory_linked_out_is_not_emptied(root: Path, outside: Path) -> None:
    # The twin deletes a cpufreq governor's tunables directory when that governor is not the
    # current one; linked outside, the old code deleted the files it found there.
    gov = (root / POLICY0 / "scaling_governor").read_text().strip()
    stale = "ondemand" if gov != "ondemand" else "conservative"
    os.symlink(outside / "schedutil", root / POLICY0 / stale)
    before = snapshot(outside)
    with pytest.raises(PathOutsideRootError, match=stale):
        LiveTwin("rk3588", root, seed=1).write_once()
    assert snapshot(outside) == before


def test_a_link_planted_while_the_twin_runs_is_skipped_without_touching_outside(root: Path, outside: Path) -> None:
    # Issue 23 item 10: the running twin skips and reports it (it used to stop).
    twin = LiveTwin("rk3588", root, seed=1)
    twin.write_once()
    twin.advance(0.1)
    replace_with_link(root / POLICY0, outside)
    before = snapshot(outside)
    twin.advance(0.1)
    twin.advance(0.1)
    assert snapshot(outside) == before
    assert any(why.startswith("PathOutsideRootError") for why in twin.skipped().values())
    assert twin.statistics().updates >= 3


def test_a_knob_linked_out_is_neither_read_nor_written(root: Path, outside: Path) -> None:
    twin = LiveTwin("rk3588", root, seed=1)
    twin.write_once()
    twin.advance(0.1)  # running from here: skip and report
    replace_with_link(root / POLICY0 / "scaling_max_freq", outside / "online")
    before = snapshot(outside)
    twin.poll_writes()
    assert "PathOutsideRootError" in twin.skipped()[f"{POLICY0}/scaling_max_freq"]
    assert twin.statistics().writes_applied == twin.statistics().writes_rejected == 0
    assert snapshot(outside) == before


def test_links_that_stay_inside_the_root_are_followed(root: Path, outside: Path) -> None:
    # A relative and an absolute link, both inside: the twin writes through them and applies
    # knob writes made through them, as on a board whose class/ entries all are links.
    cpufreq = root / "sys/devices/system/cpu/cpufreq"
    real = root / "sys/devices/system/cpufreq-real"
    cpufreq.rename(real)
    os.symlink("../cpufreq-real", cpufreq)
    zone1 = root / "sys/devices/virtual/thermal/thermal_zone1"
    zone1_real = root / "sys/zone1-real"
    zone1.rename(zone1_real)
    os.symlink(zone1_real, zone1)  # absolute, below the root
    before = snapshot(outside)
    twin = LiveTwin("rk3588", root, seed=1)
    twin.write_once()
    assert cpufreq.is_symlink() and zone1.is_symlink()
    assert (real / "policy0" / "scaling_cur_freq").read_text().strip().isdigit()
    assert (zone1_real / "temp").read_text().strip().lstrip("-").isdigit()
    avail = [int(v) for v in (real / "policy0/scaling_available_frequencies").read_text().split()]
    SysfsRoot(root).write_text(f"{POLICY0}/scaling_max_freq", avail[1])
    twin.advance(0.1)
    assert twin.statistics().writes_applied == 1
    assert int((real / "policy0/scaling_max_freq").read_text()) == avail[1]
    assert int((real / "policy0/scaling_cur_freq").read_text()) <= avail[1]
    assert snapshot(outside) == before


@pytest.mark.anyio
async def test_a_running_twin_skips_a_link_planted_under_it(root: Path, outside: Path) -> None:
    twin = LiveTwin("rk3588", root, seed=1, period_s=0.01)
    async with twin:
        await anyio.sleep(0.05)
        replace_with_link(root / ZONE0, outside)
        before = snapshot(outside)
        n = twin.statistics().updates
        with anyio.fail_after(30):  # a guard, not a measurement: the twin keeps updating
            while twin.statistics().updates < n + 3:  # noqa: ASYNC110  (the twin signals nothing; poll it)
                await anyio.sleep(0.01)
    assert any("thermal_zone0" in p and why.startswith("PathOutsideRootError") for p, why in twin.skipped().items())
    assert snapshot(outside) == before
    assert not (root / ".hetsched-twin").exists()  # the channel went with the twin


# -- the load channel -------------------------------------------------------------------------------


def test_load_channel_linked_out_is_refused(root: Path, outside: Path) -> None:
    os.symlink(outside, root / ".hetsched-twin")
    before = snapshot(outside)
    twin = LiveTwin("rk3588", root, seed=1)
    with pytest.raises(TwinError, match="load channel"):
        twin.advance(0.1)
    assert snapshot(outside) == before


def test_load_files_linked_out_are_neither_read_nor_deleted(root: Path, outside: Path) -> None:
    ch = LoadChannel.create(root)
    victim = outside / "temp"
    victim.write_text("gpu 5.0\n.end\n")  # would count, then be deleted as an ended writer's file
    os.symlink(victim, ch.path / "999999999-0123456789abcdef-0.load")
    before = snapshot(outside)
    assert ch.read() == {}
    assert ch.statistics().refused == 1
    ch.remove()
    assert snapshot(outside) == before
    assert not (root / ".hetsched-twin").exists()


# -- the command line ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda r, o: replace_with_link(r / "sys/devices/system/cpu", o), id="directory-link"),
        pytest.param(lambda r, o: replace_with_link(r / ZONE0 / "temp", o / "temp"), id="file-link"),
        pytest.param(lambda r, o: replace_with_link(r / "sys/devices/virtual", "../../../outside"), id="parent-link"),
        pytest.param(lambda r, o: os.symlink(o, r / POLICY0 / "conservative"), id="governor-dir-link"),
    ],
)
def test_cli_twin_once_refuses_planted_links(
    root: Path, outside: Path, plant: Callable[[Path, Path], object], capsys: pytest.CaptureFixture[str]
) -> None:
    plant(root, outside)
    before = snapshot(outside)
    rc = main(["twin", "rk3588", "--root", str(root), "--once"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "PathOutsideRootError" in err and "outside the twin root" in err
    assert snapshot(outside) == before


def test_cli_twin_once_over_an_existing_tree_with_inside_links_succeeds(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["twin", "rk3588", "--root", str(root), "--once"])
    assert rc == 0 and "snapshot written" in capsys.readouterr().out
    link = root / "sys/class/thermal/thermal_zone0"
    assert link.is_symlink() and os.readlink(link) == "../../devices/virtual/thermal/thermal_zone0"


# -- the dma-heap probe ---------------------------------------------------------------------------------


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Real paths of everything os.open is asked to open while the test runs."""
    seen: list[str] = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if dir_fd is None:
            seen.append(os.path.realpath(path))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", spy)
    return seen


def test_dma_heap_linked_out_of_the_root_falls_back_to_memfd(tmp_path: Path, opened: list[str]) -> None:
    heap = tmp_path / "root" / "dev" / "dma_heap"
    heap.mkdir(parents=True)
    os.symlink("/dev/null", heap / "system")  # a character device, but not this root's
    with BufferPool("host", root=tmp_path / "root") as p:
        assert p.backing == "memfd"
        assert "outside the root" in (p.backing_note or "") and "not opened" in (p.backing_note or "")
        p.acquire_nowait(100).release()
    assert "/dev/null" not in opened
    with pytest.raises(PlatformError, match="outside the root"):
        BufferPool("host", root=tmp_path / "root", backing="dma-heap")


@pytest.mark.parametrize("kind", ["regular", "fifo"])
def test_dma_heap_that_is_not_a_character_device_is_never_opened(tmp_path: Path, opened: list[str], kind: str) -> None:
    heap = tmp_path / "dev" / "dma_heap"
    heap.mkdir(parents=True)
    node = heap / "system"
    if kind == "regular":
        node.write_bytes(b"")
    else:
        os.mkfifo(node)
    with BufferPool("host", root=tmp_path) as p:
        assert p.backing == "memfd"
        note = p.backing_note or ""
        assert "not a character device" in note and ("FIFO" in note if kind == "fifo" else "regular file" in note)
    assert str(node.resolve()) not in opened


def test_dma_heap_name_must_be_a_plain_name(tmp_path: Path) -> None:
    with pytest.raises(PlatformError, match="not a heap name"):
        BufferPool("host", root=tmp_path, dma_heap="../../dev/null")
