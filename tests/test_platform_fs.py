"""SysfsRoot: confinement to the root, error translation, flaky reads."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from hetsched import HetschedError, PathOutsideRootError, SysfsError, SysfsPermissionError
from hetsched._platform import SysfsRoot


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sys/class/thermal/thermal_zone0").mkdir(parents=True)
    (root / "sys/class/thermal/thermal_zone0/temp").write_text("44384\n")
    (root / "sys/kernel").mkdir(parents=True)
    return root


def test_reads_relative_to_root(tree: Path) -> None:
    fs = SysfsRoot(tree)
    assert fs.read_text("sys/class/thermal/thermal_zone0/temp") == "44384\n"
    assert fs.read_text("/sys/class/thermal/thermal_zone0/temp") == "44384\n"  # leading slash = root-relative
    assert fs.read_int("sys/class/thermal/thermal_zone0/temp") == 44384
    assert fs.listdir("sys/class/thermal") == ["thermal_zone0"]


def test_missing_is_absent_capability(tree: Path) -> None:
    fs = SysfsRoot(tree)
    assert fs.read_text("sys/class/devfreq/dmc/cur_freq") is None
    assert fs.read_int("sys/nope") is None
    assert fs.listdir("sys/class/devfreq") == []
    assert not fs.exists("sys/class/devfreq")
    # a path *through* a regular file (ENOTDIR) is absent too
    assert fs.read_text("sys/class/thermal/thermal_zone0/temp/x") is None


def test_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(SysfsError, match="not a directory"):
        SysfsRoot(tmp_path / "missing")


def test_symlink_escaping_root_is_refused_before_touching(tree: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("do not read\n")
    os.symlink("../../../secret", tree / "sys/kernel/escape")  # root/sys/kernel -> tmp_path
    fs = SysfsRoot(tree)
    with pytest.raises(PathOutsideRootError, match="outside the root") as info:
        fs.resolve("sys/kernel/escape")
    assert isinstance(info.value, HetschedError) and isinstance(info.value, ValueError)
    with pytest.raises(PathOutsideRootError):
        fs.write_text("sys/kernel/escape", "pwned")
    assert secret.read_text() == "do not read\n"  # nothing written
    # A read, an exists, a listdir: the link is not there (unreadable), nothing outside is opened.
    assert fs.read_text("sys/kernel/escape") is None
    assert not fs.exists("sys/kernel/escape") and not fs.is_dir("sys/kernel/escape")
    assert fs.listdir("sys/kernel/escape") == []
    assert list(fs.unreadable()) == ["sys/kernel/escape"]
    assert fs.unreadable()["sys/kernel/escape"].startswith("PathOutsideRootError: ")
    assert fs.statistics().unreadable_reads == 4


def test_absolute_symlink_out_of_root_is_refused(tree: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("1\n")
    os.symlink(target, tree / "sys/kernel/abs")
    fs = SysfsRoot(tree)
    assert fs.read_text("sys/kernel/abs") is None
    assert "PathOutsideRootError" in fs.unreadable()["sys/kernel/abs"]
    with pytest.raises(PathOutsideRootError):
        fs.realpath("sys/kernel/abs")


def test_dotdot_is_refused(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "outside").write_text("x")
    fs = SysfsRoot(tree)
    assert fs.read_text("sys/../../outside") is None
    with pytest.raises(PathOutsideRootError):
        fs.resolve("sys/../../outside")
    with pytest.raises(PathOutsideRootError):
        fs.write_text("../outside", "y")
    assert (tmp_path / "outside").read_text() == "x"
    # .. that stays inside is fine
    assert fs.read_int("sys/kernel/../class/thermal/thermal_zone0/temp") == 44384


def test_symlinks_inside_root_resolve(tree: Path) -> None:
    os.symlink("../class/thermal/thermal_zone0", tree / "sys/kernel/tz")
    fs = SysfsRoot(tree)
    assert fs.read_int("sys/kernel/tz/temp") == 44384
    assert fs.realpath("sys/kernel/tz") == "sys/class/thermal/thermal_zone0"


def test_write_existing_file(tree: Path) -> None:
    fs = SysfsRoot(tree)
    fs.write_text("sys/class/thermal/thermal_zone0/temp", 50000)
    assert fs.read_int("sys/class/thermal/thermal_zone0/temp") == 50000
    assert fs.statistics().writes == 1


def test_write_never_creates(tree: Path) -> None:
    fs = SysfsRoot(tree)
    with pytest.raises(SysfsError, match="sys/class/thermal/thermal_zone0/new") as info:
        fs.write_text("sys/class/thermal/thermal_zone0/new", 1)
    assert info.value.errno == errno.ENOENT
    assert not (tree / "sys/class/thermal/thermal_zone0/new").exists()


def test_resolved_path_refuses_a_symlink_swapped_in(tree: Path, tmp_path: Path) -> None:
    fs = SysfsRoot(tree)
    resolved = fs.resolve("sys/class/thermal/thermal_zone0/temp")
    assert fs.read_int(resolved) == 44384
    target = tmp_path / "secret"
    target.write_text("7\n")
    os.unlink(resolved.path)
    os.symlink(target, resolved.path)
    assert fs.read_int(resolved) is None  # O_NOFOLLOW: ELOOP, not a read of the secret
    assert "symbolic link" in fs.unreadable()["sys/class/thermal/thermal_zone0/temp"]


def test_eagain_from_a_real_fifo_reads_as_none(tree: Path) -> None:
    # A FIFO with a writer but no data returns EAGAIN to a non-blocking read,
    # which is exactly what a fused-off Orin cv zone does.
    fifo = tree / "sys/class/thermal/thermal_zone0/flaky"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        fs = SysfsRoot(tree)
        assert fs.read_text("sys/class/thermal/thermal_zone0/flaky") is None
        assert fs.read_int("sys/class/thermal/thermal_zone0/flaky") is None
        assert fs.statistics().flaky_reads == 2
    finally:
        os.close(wfd)
        os.close(rfd)


@pytest.fixture
def failing_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make os.read fail with the errno put in the returned list (EIO/ENODATA cannot be produced by a tmpfs)."""
    code: list[int] = []
    real = os.read

    def fake(fd: int, n: int) -> bytes:
        if code:
            raise OSError(code[0], os.strerror(code[0]))
        return real(fd, n)

    monkeypatch.setattr(os, "read", fake)
    return code


@pytest.mark.parametrize("code", [errno.EIO, errno.ENODATA, errno.EAGAIN])
def test_flaky_errnos_read_as_none(tree: Path, failing_read: list[int], code: int) -> None:
    fs = SysfsRoot(tree)
    failing_read.append(code)
    assert fs.read_text("sys/class/thermal/thermal_zone0/temp") is None
    assert fs.statistics().flaky_reads == 1


def test_other_errnos_are_sysfs_errors(tree: Path, failing_read: list[int]) -> None:
    fs = SysfsRoot(tree)
    failing_read.append(errno.EINVAL)
    with pytest.raises(SysfsError, match="thermal_zone0/temp") as info:
        fs.read_text("sys/class/thermal/thermal_zone0/temp")
    assert isinstance(info.value.__cause__, OSError) and info.value.errno == errno.EINVAL


def test_permission_error_injected(tree: Path, failing_read: list[int]) -> None:
    fs = SysfsRoot(tree)
    failing_read.append(errno.EACCES)
    with pytest.raises(SysfsPermissionError, match="thermal_zone0/temp") as info:
        fs.read_text("sys/class/thermal/thermal_zone0/temp")
    assert isinstance(info.value, PermissionError)
    assert isinstance(info.value.__cause__, PermissionError)


def test_a_directory_where_a_value_belongs_is_unreadable_once(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Issue 23 item 8: a directory in place of a value file stopped every tool (SysfsError).
    temp = tree / "sys/class/thermal/thermal_zone0/temp"
    temp.unlink()
    temp.mkdir()
    fs = SysfsRoot(tree)
    with caplog.at_level("WARNING", logger="hetsched.platform"):
        assert [fs.read_int("sys/class/thermal/thermal_zone0/temp") for _ in range(3)] == [None] * 3
        resolved = fs.resolve("sys/class/thermal/thermal_zone0/temp")
        assert fs.read_bytes(resolved) is None  # the hot loop's pre-resolved path too
    assert fs.unreadable() == {"sys/class/thermal/thermal_zone0/temp": "is a directory"}
    assert fs.statistics().unreadable_reads == 4
    assert len([r for r in caplog.records if "unreadable" in r.getMessage()]) == 1  # reported once
    with pytest.raises(SysfsError, match="thermal_zone0"):  # a write is not lenient
        fs.write_text("sys/class/thermal/thermal_zone0/temp", 1)


def test_an_endless_node_is_read_bounded(tree: Path) -> None:
    # A character device planted where a value belongs (/dev/zero, linked inside the root by a
    # bind in a real fake tree; here the root's own copy via a link that stays inside).
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero on this host")
    dev = tree / "dev"
    dev.mkdir()
    try:
        os.mknod(dev / "zero", 0o644 | 0o020000, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("mknod needs root")
    fs = SysfsRoot(tree)
    assert fs.read_bytes("dev/zero") is None
    assert "more than" in fs.unreadable()["dev/zero"]


_UNPRIVILEGED = textwrap.dedent(
    """
    import os, sys
    # Import first: the interpreter's own files may not be readable by 'nobody'.
    from hetsched import SysfsPermissionError
    from hetsched._platform import SysfsRoot
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    fs = SysfsRoot(sys.argv[1])
    out = []
    for action in ("read", "write", "listdir"):
        try:
            if action == "read":
                fs.read_text("sys/kernel/debug/rknpu/load")
            elif action == "write":
                fs.write_text("sys/devices/system/cpu/cpufreq/policy0/scaling_governor", "performance")
            else:
                fs.listdir("sys/kernel/debug/rknpu")
            out.append(action + ":ok")
        except SysfsPermissionError as exc:
            out.append(action + ":denied:" + str(exc))
    print("|".join(out))
    """
)


@pytest.mark.skipif(not hasattr(os, "setuid") or os.geteuid() != 0, reason="needs root to drop privileges")
def test_real_permission_errors_as_unprivileged_user(tmp_path: Path) -> None:
    # We run as root, which bypasses file modes; a child that drops to 'nobody' meets them for real.
    # pytest's tmp_path sits under a 0700 directory, so the tree goes in a world-traversable temp dir.
    base = Path(tempfile.mkdtemp(prefix="hetsched-perm-"))
    try:
        base.chmod(0o755)
        root = base / "root"
        debug = root / "sys/kernel/debug/rknpu"
        debug.mkdir(parents=True)
        (debug / "load").write_text("NPU load:  Core0:  0%, Core1:  0%, Core2:  0%,\n")
        (debug / "load").chmod(0o400)
        pol = root / "sys/devices/system/cpu/cpufreq/policy0"
        pol.mkdir(parents=True)
        (pol / "scaling_governor").write_text("ondemand\n")
        (pol / "scaling_governor").chmod(0o644)
        for p in [root, *root.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)
        debug.chmod(0o700)  # debugfs: root-only directory
        proc = subprocess.run(
            [sys.executable, "-c", _UNPRIVILEGED, str(root)], capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 0, proc.stderr
        parts = proc.stdout.strip().split("|")
        assert parts[0].startswith("read:denied:") and "sys/kernel/debug/rknpu/load" in parts[0]
        assert parts[1].startswith("write:denied:") and "scaling_governor" in parts[1]
        assert parts[2].startswith("listdir:denied:")
        assert (pol / "scaling_governor").read_text() == "ondemand\n"
    finally:
        shutil.rmtree(base)
