"""Layering (docs/architecture.md): every part imports only from the tiers below it, and no
module of the package takes part in an import cycle.

Imports are read with ``ast`` from every module, lazy (function-level) imports and
``TYPE_CHECKING`` ones included, with relative imports resolved, so a violation anywhere in a
file is caught. There is no whitelist: a part may import exactly the parts of lower tiers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

import hetsched

PKG = Path(hetsched.__file__).parent
REPO = PKG.parent

# Where each part of the installed package lives (hetsched.backends and hetsched.policies are
# top-level folders of the repository, see package-dir in pyproject.toml).
SOURCES = {"hetsched": PKG, "hetsched.backends": REPO / "backends", "hetsched.policies": REPO / "policies"}

# The tiers, bottom up (docs/architecture.md, "Layers"). A part is a subpackage or a top-level
# module of hetsched, found by its name's prefix (hetsched._session.* is the session layer
# whichever modules it holds); the backends are two parts: the seam (backends/__init__.py,
# backends/_base.py) and the backends above it (every other file of backends/).
TIERS: tuple[frozenset[str], ...] = tuple(frozenset(t) for t in (
    {"_compat", "_snapshot", "_onnxruntime"},             # 0. vocabulary: 3.10 stand-ins, snapshots, onnxruntime's class
    {"_errors"},                                          #    the exception tree
    {"_events"},                                          #    events, priorities, hooks
    {"_platform", "_memory"},                             # 1. board files; memory shared below the runtime
    {"backends", "policies", "_twin"},                    # 2. the backend seam, placement policies, the SoC twin
    {"_planning", "_rknn", "_runtime"},                   # 3. planning; Rockchip's toolkit; executing plans
    {"backends.impl"},                                    # 4. the backends
    {"_estimators"},                                      # 5. where the real board meets the twin
    {"_devices", "_governor"},                            # 6. device resolution; the DVFS governor
    {"_session"},                                         # 7. sessions
    {"testing", "onnx_backend", "train"},                 # 8. front ends: test helpers, the ONNX backend, training hooks
    {"__init__", "lowlevel"},                             #    the public namespaces
    {"_cli"},                                             #    the command line (over the public namespace)
    {"__main__"},                                         #    ``python -m hetsched``
))
TIER = {part: n for n, tier in enumerate(TIERS) for part in tier}

# Parts that run on a real board: no path of imports, however indirect and however lazy,
# may lead from them to the twin (the simulator).
REAL_BOARD = frozenset({"_compat", "_snapshot", "_onnxruntime", "_errors", "_events", "_platform", "_memory",
                        "backends", "policies", "_planning", "_rknn", "_runtime"})
# Backends (and helpers) of the real board among backends.impl: real-board code too.
REAL_BOARD_BACKENDS = ("cpu", "ort_gpu", "tensorrt", "_tensorrt_build", "_tensorrt_cache", "_tensorrt_run",
                       "_rknn_lite", "_ncnn_cache", "_ncnn_convert", "_ncnn_devices", "_probe")
TWIN_WIRING = "hetsched._estimators"
"""The one module outside the twin-aware parts through which real-board device resolution
reaches the twin (a board root's simulated devices, a board's power model)."""


def part_of(module: str) -> str | None:
    """The part of a ``hetsched`` module name (None: not hetsched's)."""
    names = module.split(".")
    if names[0] != "hetsched":
        return None
    if len(names) == 1:
        return "__init__"
    head = names[1]
    if head == "backends":
        return "backends" if len(names) == 2 or names[2] in ("__init__", "_base") else "backends.impl"
    if head.startswith("_session"):  # the package, and any flat module a move leaves behind
        return "_session"
    return head


def _files() -> Iterator[tuple[str, Path, bool]]:
    """``(module name, file, is a package __init__)`` of every module of the package."""
    for top, folder in SOURCES.items():
        for f in sorted(folder.rglob("*.py")):
            rel = f.relative_to(folder)
            parts = [*rel.parent.parts] if rel.name == "__init__.py" else [*rel.parent.parts, rel.stem]
            yield ".".join((top, *parts)), f, rel.name == "__init__.py"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, package: str) -> list[tuple[str, bool]]:
    """``(absolute name, runs)`` for every name ``path`` imports: relative imports resolved,
    function-level ones included; ``runs`` is False under ``if TYPE_CHECKING:`` (annotations only)."""
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.Import):
            out.extend((a.name, runs) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            # each name is a module of ``mod`` or an attribute of it (then the graph takes ``mod``);
            # a module's parent packages are imported with it anyway, so ``mod`` alone is no edge
            out.extend((f"{mod}.{a.name}", runs) for a in node.names)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        for sub in ast.iter_child_nodes(node):
            visit(sub, runs)

    visit(ast.parse(path.read_text(), str(path)), True)
    return out


@cache
def _graph() -> dict[str, tuple[str, str, dict[str, bool]]]:
    """``module -> (file, part, {imported hetsched module: runs})``: each imported name resolved to
    the module it names (``from pkg import name`` is ``pkg.name`` when that is a module, else ``pkg``)."""
    files = list(_files())
    modules = {name for name, _, _ in files}
    out: dict[str, tuple[str, str, dict[str, bool]]] = {}
    for name, f, is_pkg in files:
        package = name if is_pkg else name.rpartition(".")[0]
        edges: dict[str, bool] = {}
        for imported, runs in _imports(f, package):
            target = imported
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[target] = edges.get(target, False) or runs
        part = part_of(name)
        assert part is not None
        out[name] = (str(f.relative_to(REPO)), part, edges)
    return out


def test_relative_imports_resolve_to_absolute_names(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from .. import _twin\nfrom .._twin.sim import SimBoard\nfrom . import power\n"
                   "def f():\n    import hetsched._cli\n"
                   "if TYPE_CHECKING:\n    from hetsched._session import Session\n")
    got = dict(_imports(src, "hetsched._platform"))
    assert {"hetsched._twin", "hetsched._twin.sim.SimBoard", "hetsched._platform.power", "hetsched._cli"} <= set(got)
    assert got["hetsched._cli"] is True and got["hetsched._session.Session"] is False  # lazy runs; TYPE_CHECKING not


def test_parts_are_placed_by_package_prefix() -> None:
    assert part_of("hetsched._session._core") == part_of("hetsched._session") == "_session"
    assert part_of("hetsched.backends._base") == part_of("hetsched.backends") == "backends"
    assert part_of("hetsched.backends.sim") == part_of("hetsched.backends._tensorrt_run") == "backends.impl"
    assert part_of("hetsched._runtime._loops._trio") == "_runtime" and part_of("numpy") is None


def test_every_part_has_a_tier() -> None:
    parts = {part for _, part, _ in _graph().values()}
    assert parts - set(TIER) == set(), "give new parts a tier in TIERS and docs/architecture.md"
    assert set(TIER) - parts == set(), "a tier names a part that no longer exists"


@pytest.mark.parametrize("part", sorted(TIER))
def test_a_part_imports_only_parts_of_lower_tiers(part: str) -> None:
    graph = _graph()
    offenders = {
        f"{f} -> {target}": f"{part} (tier {TIER[part]}) imports {graph[target][1]} (tier {TIER[graph[target][1]]})"
        for f, p, edges in graph.values() if p == part
        for target in edges if graph[target][1] != part and TIER[graph[target][1]] >= TIER[part]
    }
    assert offenders == {}


def _reaches(start: str, goal: set[str], skip: frozenset[str] = frozenset()) -> list[str] | None:
    """An import path (lazy imports included) from module ``start`` to a module in ``goal``, or None."""
    graph = _graph()
    seen = {start}
    stack = [(start, [start])]
    while stack:
        mod, path = stack.pop()
        for target in graph[mod][2]:
            if target in seen or target in skip:
                continue
            if target in goal:
                return [*path, target]
            seen.add(target)
            stack.append((target, [*path, target]))
    return None


def _real_board_modules() -> list[str]:
    graph = _graph()
    return sorted(m for m, (_, part, _) in graph.items()
                  if part in REAL_BOARD or (part == "backends.impl" and m.rsplit(".", 1)[1] in REAL_BOARD_BACKENDS))


def test_real_board_code_never_reaches_the_simulator() -> None:
    """From a module that runs on a real board, no chain of imports (however indirect, however
    lazy) leads to the twin."""
    twin = {m for m, (_, part, _) in _graph().items() if part == "_twin"}
    paths = {m: " -> ".join(p) for m in _real_board_modules() if (p := _reaches(m, twin)) is not None}
    assert paths == {}


def test_device_resolution_reaches_the_twin_only_through_the_wiring_module() -> None:
    """A board root's simulated devices come from ``_estimators``; nothing else in ``_devices`` leads
    to the twin or its backend."""
    graph = _graph()
    twin = {m for m, (_, part, _) in graph.items() if part == "_twin"} | {"hetsched.backends.sim"}
    devices = [m for m, (_, part, _) in graph.items() if part == "_devices"]
    paths = {m: " -> ".join(p) for m in devices if (p := _reaches(m, twin, skip=frozenset({TWIN_WIRING}))) is not None}
    assert paths == {}
    assert any(TWIN_WIRING in graph[m][2] for m in devices)  # and through it, they do


def test_the_path_finder_follows_lazy_imports() -> None:
    # _estimators imports the twin's backend inside a function only: still a path to the twin
    graph = _graph()
    assert graph[TWIN_WIRING][2]["hetsched.backends.sim"] is True
    assert _reaches(TWIN_WIRING, {m for m in graph if m.startswith("hetsched._twin")}) is not None


def _cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return out


def test_cycle_detection_finds_a_lazy_cycle() -> None:
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert _cycles({"a": ["b"], "b": []}) == []


def test_no_import_cycles() -> None:
    """No module reaches itself through imports that run: module-level and function-level ones
    (``if TYPE_CHECKING:`` imports are annotations, never executed, and left out). A package's
    ``__init__`` importing its modules is an edge like any other; a module importing its own
    package's ``__init__`` back closes a cycle."""
    edges = {m: [t for t, runs in e.items() if runs] for m, (_, _, e) in _graph().items()}
    assert _cycles(edges) == []


def test_only_the_command_line_imports_the_command_line() -> None:
    offenders = [f for f, p, edges in _graph().values()
                 if p not in ("_cli", "__main__") and any(t.startswith("hetsched._cli") for t in edges)]
    assert offenders == []


def test_event_loop_libraries_are_imported_only_by_the_loop_modules() -> None:
    loops = PKG / "_runtime" / "_loops"
    offenders = []
    for _name, f, _ in _files():
        if loops in f.parents:
            continue
        mods = {m for m, _ in _imports(f, "hetsched")}
        if mods & {"asyncio", "trio", "sniffio"} or any(m.startswith(("asyncio.", "trio.", "sniffio.")) for m in mods):
            offenders.append(str(f.relative_to(REPO)))
    assert offenders == []


def test_no_test_skips_over_a_module_of_ours() -> None:
    """A broken hetsched module must fail its tests, never skip them: ``importorskip`` is for
    optional third-party SDKs only."""
    call = "importorskip(" + '"hetsched'
    offenders = [f"{f.name}:{n}" for f in sorted((REPO / "tests").glob("*.py"))
                 for n, line in enumerate(f.read_text().splitlines(), 1)
                 if call in line.replace("'", '"')]
    assert not offenders, offenders


CLOCK_READS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns"}


def test_the_session_and_runtime_layers_read_only_the_injected_clock() -> None:
    """A session takes ``clock=``: every time it reads goes through it (a virtual clock in the
    tests, the system clock otherwise). Only the clock module itself names ``time.monotonic``
    and ``time.perf_counter``; a default argument value (``clock=time.perf_counter``) is an
    injection point, not a read."""
    offenders = []
    for rel, part, _ in _graph().values():
        if part not in ("_session", "_runtime") or rel.endswith("_runtime/_clock.py"):
            continue
        tree = ast.parse((REPO / rel).read_text(), rel)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in CLOCK_READS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "time"):
                offenders.append(f"{rel}:{node.lineno}: time.{node.func.attr}()")
    assert not offenders, offenders
