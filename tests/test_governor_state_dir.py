"""The governor's state directory has one owner, :class:`StateDir` (issue 25).

The lock, the state file ``top`` and ``doctor`` read, the saved knobs a dead governor leaves and
the contained walk all go through it: a contended lock is refused, a state directory that is a
link out of the root is never followed, a FIFO at a file's name is neither read nor waited on,
a stale lock of a dead pid is no owner, a restore with nothing saved changes nothing. Ports say
what they can do as attributes (no ``isinstance`` sniffing in ``_governor``), ``hetsched
restore`` only descends (command -> state directory -> sysfs), and the modules of
``hetsched._governor`` import each other without a cycle (module- and function-level imports).
"""

from __future__ import annotations

import ast
import json
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import hetsched
from hetsched import GovernorBusyError, SysfsError
from hetsched._cli import main
from hetsched._governor import GovernorEngine, SimPort
from hetsched._governor._knobs import expected_knobs
from hetsched._governor._ports import ClockPort
from hetsched._governor._published import Publisher
from hetsched._governor._state_dir import StateDir, encode_knobs
from hetsched._governor._state_walk import LOCK_FILE, RUN_DIR, SAVED_FILE, STATE_FILE, RunDir
from hetsched._governor._sysfs import SysfsPort
from hetsched._platform._fs import SysfsRoot
from hetsched.testing import build_board_tree, dvfs_knobs

GOVERNOR = Path(hetsched.__file__).resolve().parent / "_governor"
CPU0 = "sys/devices/system/cpu/cpufreq/policy0"
DEAD_PID = 2**22 + 17  # above the kernel's pid_max ceiling (4194304): never a running process


@pytest.fixture
def board(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    root = build_board_tree(tmp_path / "board", "rk3588")
    return root, dvfs_knobs(root)


def _dead_governors_file(root: Path, *, pid: int = DEAD_PID, locked: bool = True) -> str:
    """Leave what a SIGKILLed governor leaves: its saved knobs (the board's), a knob changed since.

    Returns the changed knob's path."""
    port = SysfsPort(root, sleep=lambda s: None, recover=False)
    saved = port.save()
    port.release_lock()
    doc = {"format": 1, "pid": pid, "soc": port.soc, "started_unix": 0.0, "knobs": encode_knobs(saved)}
    if locked:
        doc["locked"] = True
    RunDir(SysfsRoot(root)).write(SAVED_FILE, doc)
    knob = f"{CPU0}/scaling_max_freq"
    lowest = min(int(x) for x in (root / CPU0 / "scaling_available_frequencies").read_text().split())
    (root / knob).write_text(f"{lowest}\n")
    return knob


# -- the lock ------------------------------------------------------------------------------


def test_lock_contention_between_two_owners_is_refused_then_handed_over(board: tuple[Path, dict[str, bytes]]) -> None:
    root, _ = board
    first, second = StateDir(SysfsRoot(root)), StateDir(SysfsRoot(root))
    first.lock()
    first.lock()  # idempotent for its holder
    assert first.locked and (root / RUN_DIR / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    with pytest.raises(GovernorBusyError) as err:
        second.lock()
    assert err.value.pid == os.getpid() and not second.locked
    assert second.probe().held is True and second.probe().pid == os.getpid()
    first.unlock()
    assert not first.locked and not (root / "run").exists(), "the lock's directories were left behind"
    assert second.probe().held is None  # no lock file at all now
    second.lock()
    assert second.locked and first.probe().held is True
    second.close(restored=True)
    assert not (root / "run").exists()


def test_a_stale_lock_of_a_dead_pid_is_no_owner(board: tuple[Path, dict[str, bytes]]) -> None:
    root, _ = board
    (root / RUN_DIR).mkdir(parents=True)
    (root / RUN_DIR / LOCK_FILE).write_text(f"{DEAD_PID}\n")  # its holder died: nobody flocks it
    sd = StateDir(SysfsRoot(root))
    state = sd.probe()
    assert state.held is False and state.pid == DEAD_PID
    sd.lock()
    assert sd.locked and (root / RUN_DIR / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    sd.unlock()
    assert not (root / RUN_DIR / LOCK_FILE).exists()


def test_a_dead_pids_saved_knobs_under_its_stale_lock_are_restored(board: tuple[Path, dict[str, bytes]]) -> None:
    root, before = board
    knob = _dead_governors_file(root)
    (root / RUN_DIR / LOCK_FILE).write_text(f"{DEAD_PID}\n")
    assert dvfs_knobs(root) != before
    sd = StateDir(SysfsRoot(root))
    assert sd.saved_owner_alive(sd.read().saved or {}) == (False, DEAD_PID)
    out = sd.restore_saved()
    assert out.status == "restored" and out.exit_code == 0 and knob in out.written, out.message
    assert dvfs_knobs(root) == before and not sd.locked
    assert not (root / RUN_DIR).exists(), "the restore left its lock or the saved file behind"


def test_a_saved_file_whose_lock_is_held_is_refused_unless_forced(board: tuple[Path, dict[str, bytes]]) -> None:
    root, before = board
    _dead_governors_file(root)
    holder = StateDir(SysfsRoot(root))
    holder.lock()
    try:
        changed = dvfs_knobs(root)
        out = StateDir(SysfsRoot(root)).restore_saved()
        assert out.status == "refused" and out.pid == os.getpid() and "holds the governor lock" in out.message
        assert dvfs_knobs(root) == changed
        assert StateDir(SysfsRoot(root)).restore_saved(force=True).status == "restored"
        assert dvfs_knobs(root) == before
    finally:
        holder.unlock()


# -- the contained walk ---------------------------------------------------------------------


def _outside_with_files(tmp_path: Path) -> Path:
    """A host's ``/run/hetsched`` with a live governor's files (what a link would lead to)."""
    outside = tmp_path / "host-run" / "hetsched"
    outside.mkdir(parents=True)
    (outside / STATE_FILE).write_text(json.dumps({"pid": os.getpid(), "phase": "forward"}))
    (outside / SAVED_FILE).write_text(json.dumps({"pid": DEAD_PID, "knobs": {}}))
    return outside


def _tree(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("link", ["run", RUN_DIR])
def test_a_state_dir_that_links_out_of_the_root_is_never_followed(
    board: tuple[Path, dict[str, bytes]], tmp_path: Path, link: str
) -> None:
    root, before = board
    outside = _outside_with_files(tmp_path)
    files = _tree(outside)
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside if link == RUN_DIR else outside.parent, root / link)
    assert json.loads((root / RUN_DIR / STATE_FILE).read_text())["phase"] == "forward"  # reachable if followed
    sd = StateDir(SysfsRoot(root))
    pub = sd.read()
    assert pub.state is None and pub.saved is None  # the outside files are not read
    assert sd.restore_saved().status == "nothing"
    assert sd.probe().held is None
    with pytest.raises(SysfsError):
        sd.lock()
    with pytest.raises(OSError, match="outside the root"):
        sd.publish(STATE_FILE, {"phase": "idle"})
    sd.close(restored=True)
    assert _tree(outside) == files and dvfs_knobs(root) == before
    assert sorted(p.name for p in outside.parent.iterdir()) == ["hetsched"]


def test_a_link_at_the_state_files_name_is_not_followed(board: tuple[Path, dict[str, bytes]]) -> None:
    root, _ = board
    (root / RUN_DIR).mkdir(parents=True)
    (root / "elsewhere.json").write_text(json.dumps({"pid": 1, "phase": "forward"}))
    os.symlink(root / "elsewhere.json", root / RUN_DIR / STATE_FILE)
    pub = StateDir(SysfsRoot(root)).read()
    assert pub.state is None and "is a link" in pub.errors[f"{RUN_DIR}/{STATE_FILE}"]


@pytest.mark.parametrize("name", [STATE_FILE, SAVED_FILE])
def test_a_fifo_as_a_state_file_is_neither_read_nor_waited_on(
    board: tuple[Path, dict[str, bytes]], name: str
) -> None:
    root, before = board
    (root / RUN_DIR).mkdir(parents=True)
    os.mkfifo(root / RUN_DIR / name)
    done: list[object] = []

    def read() -> None:  # in a thread: a blocking open would hang the test, not fail it
        sd = StateDir(SysfsRoot(root))
        done.append(sd.read())
        done.append(sd.restore_saved())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        with open(root / RUN_DIR / name, "wb"):  # unblock the reader before failing
            pass
        pytest.fail("reading a FIFO state file blocked")
    pub, out = done
    rel = f"{RUN_DIR}/{name}"
    assert "a FIFO" in pub.errors[rel] and "not a regular file" in pub.errors[rel]  # type: ignore[attr-defined]
    assert out.status == ("malformed" if name == SAVED_FILE else "nothing")  # type: ignore[attr-defined]
    assert dvfs_knobs(root) == before and (root / RUN_DIR / name).is_fifo()


def test_a_restore_with_no_state_changes_nothing(board: tuple[Path, dict[str, bytes]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    root, before = board
    out = StateDir(SysfsRoot(root)).restore_saved()
    assert out.status == "nothing" and out.exit_code == 0 and out.written == ()
    assert not (root / "run").exists(), "a restore with nothing saved made the state directory"
    assert main(["restore", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "nothing"
    assert dvfs_knobs(root) == before and not (root / "run").exists()


# -- closing: files before the lock ---------------------------------------------------------


def test_close_removes_its_files_then_the_lock_and_keeps_unrestored_knobs(board: tuple[Path, dict[str, bytes]]) -> None:
    root, _ = board
    sd = StateDir(SysfsRoot(root))
    sd.lock()
    sd.publish(SAVED_FILE, {"pid": os.getpid(), "knobs": {}})
    sd.publish(STATE_FILE, {"pid": os.getpid(), "phase": "idle"})
    assert json.loads((root / RUN_DIR / SAVED_FILE).read_text())["locked"] is True
    assert sd.saved_owner_alive(sd.read().saved or {}) == (True, os.getpid())
    stats = sd.statistics()
    assert stats.locked and stats.published == (SAVED_FILE, STATE_FILE) and stats.writes == 2 and stats.locks == 1
    sd.close(restored=False)  # knobs not back: the saved file is the record of them
    assert sd.statistics().published == (SAVED_FILE,) and not sd.statistics().locked
    assert sorted(p.name for p in (root / RUN_DIR).iterdir()) == [SAVED_FILE]
    assert not sd.locked
    sd.close(restored=True)  # once more, knobs back: it wrote the saved file, so now it goes
    assert list((root / RUN_DIR).iterdir()) == []


def test_another_governors_files_are_never_withdrawn(board: tuple[Path, dict[str, bytes]]) -> None:
    root, _ = board
    theirs = StateDir(SysfsRoot(root))
    theirs.publish(STATE_FILE, {"pid": 1, "phase": "forward"})
    mine = StateDir(SysfsRoot(root))
    mine.close(restored=True)
    assert (root / RUN_DIR / STATE_FILE).exists()
    theirs.close(restored=True)
    assert not (root / "run").exists()


# -- capabilities, not isinstance --------------------------------------------------------------


def test_ports_declare_their_capabilities(board: tuple[Path, dict[str, bytes]]) -> None:
    root, _ = board
    port = SysfsPort(root, sleep=lambda s: None)
    assert isinstance(port.state_dir, StateDir) and port.state_dir.fs is port.fs
    assert port.integrates_samples_by_telemetry is True
    from hetsched._twin.sim import SimBoard

    sim = SimPort(SimBoard("rk3588"))
    assert sim.state_dir is None and sim.integrates_samples_by_telemetry is False
    assert ClockPort.state_dir is None and ClockPort.integrates_samples_by_telemetry is False


def test_a_port_of_its_own_with_a_state_dir_gets_the_files_published(board: tuple[Path, dict[str, bytes]]) -> None:
    """What publishes is the port's ``state_dir`` attribute, not its class: a simulated port
    handed a state directory publishes into it (and closes it at the end)."""
    from hetsched._twin.sim import SimBoard

    root, _ = board
    port = SimPort(SimBoard("rk3588"))
    port.state_dir = StateDir(SysfsRoot(root))
    engine = GovernorEngine(port, autotune=False)
    engine.start()
    engine.enter("forward")
    state = json.loads((root / RUN_DIR / STATE_FILE).read_text())
    assert state["pid"] == os.getpid() and state["phase"] == "forward"
    engine.close()
    assert not (root / "run").exists()
    assert not Publisher(None).enabled


def _governor_sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(GOVERNOR.glob("*.py")):
        yield path.stem, ast.parse(path.read_text(), str(path))


def test_no_isinstance_sniffing_of_ports_in_the_governor() -> None:
    ports = {"SysfsPort", "SimPort", "ClockPort"}
    found = []
    for name, tree in _governor_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} if len(node.args) > 1 else set()
                if names & ports:
                    found.append(f"{name}.py:{node.lineno}")
    assert not found, f"isinstance on a port (declare a capability on ClockPort instead): {found}"


# -- the descent of `hetsched restore` --------------------------------------------------------

# Lower numbers call higher ones only: the command, the state directory, what it owns, the walk, the platform.
_RANK = {"_cli/_restore.py": 0, "_governor/_state_dir.py": 1, "_governor/_knobs.py": 2, "_governor/_lock.py": 2,
         "_governor/_state_walk.py": 3}


def test_hetsched_restore_is_a_straight_descent(board: tuple[Path, dict[str, bytes]],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from hetsched._cli import _restore

    root, before = board
    _dead_governors_file(root)
    pkg = str(Path(hetsched.__file__).resolve().parent) + os.sep
    edges: set[tuple[str, str]] = set()

    def prof(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and frame.f_back is not None:
            callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
            if callee.startswith(pkg) and caller.startswith(pkg) and callee != caller:
                edges.add((caller[len(pkg):], callee[len(pkg):]))

    sys.setprofile(prof)
    try:
        rc = _restore.run(argparse.Namespace(root=str(root), force=False, json=False))
    finally:
        sys.setprofile(None)
    assert rc == 0 and dvfs_knobs(root) == before, capsys.readouterr().out

    def rank(f: str) -> int:
        return _RANK.get(f, 9 if f.startswith(("_platform/", "_errors")) else -1)

    unknown = sorted({f for e in edges for f in e if rank(f) < 0})
    assert not unknown, f"hetsched restore passes through files outside its descent: {unknown}"
    upward = sorted(e for e in edges if rank(e[1]) <= rank(e[0]))
    assert not upward, f"hetsched restore climbs back up (caller -> callee): {upward}"
    assert ("_cli/_restore.py", "_governor/_state_dir.py") in edges


# -- no import cycle inside hetsched._governor ------------------------------------------------


def _imports(name: str, tree: ast.Module, package: str, modules: set[str]) -> set[str]:
    """The sibling modules ``name`` imports anywhere (module level, in functions, under TYPE_CHECKING)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = node.module or ""
                targets = [base] if base else [a.name for a in node.names]
                if base == "":
                    targets.append("__init__")
            elif node.level == 0 and node.module is not None and node.module.startswith(package):
                rest = node.module[len(package):].lstrip(".")
                targets = [rest.split(".")[0] if rest else "__init__"]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(package + "."):
                    targets.append(alias.name[len(package) + 1:].split(".")[0])
        out.update(t for t in targets if t in modules and t != name)
    return out


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import cycle in ``graph`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def _graph(directory: Path, package: str) -> dict[str, set[str]]:
    sources = {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(directory.glob("*.py"))}
    return {name: _imports(name, tree, package, set(sources)) for name, tree in sources.items()}


def test_the_cycle_finder_sees_a_function_level_cycle(tmp_path: Path) -> None:
    """The finder itself can fail: the shape the state files had (a module-level import one way,
    a function-level import back) is a cycle."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_published.py").write_text("def f():\n    from ._sysfs import Port\n    return Port\n")
    (pkg / "_sysfs.py").write_text("from ._lock import RootLock\n")
    (pkg / "_lock.py").write_text("from pkg._published import RUN_DIR\n")
    assert find_cycle(_graph(pkg, "pkg")) == ["_lock", "_published", "_sysfs", "_lock"]
    (pkg / "_lock.py").write_text("RUN_DIR = 'run'\n")
    assert find_cycle(_graph(pkg, "pkg")) is None


def test_no_import_cycle_inside_the_governor() -> None:
    graph = _graph(GOVERNOR, "hetsched._governor")
    assert "_state_dir" in graph and "_state_walk" in graph["_lock"]
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle inside hetsched._governor: {' -> '.join(cycle or [])}"


def test_the_state_directory_imports_only_downwards() -> None:
    graph = _graph(GOVERNOR, "hetsched._governor")
    assert graph["_state_walk"] == set()
    assert graph["_lock"] == {"_state_walk"}
    assert graph["_knobs"] == set()
    assert graph["_state_dir"] == {"_knobs", "_lock", "_state_walk"}


def test_expected_knobs_still_skip_an_unlocked_emc_rate() -> None:
    """The knob rules moved to ``_knobs`` unchanged: an EMC rate counts only while it was locked."""
    emc = "sys/kernel/debug/bpmp/debug/clk/emc"
    assert expected_knobs({f"{emc}/mrq_rate_locked": b"0\n", f"{emc}/rate": b"2133000000\n"}) == {
        f"{emc}/mrq_rate_locked": b"0\n"}
