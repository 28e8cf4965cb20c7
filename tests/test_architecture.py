"""Layering (docs/architecture.md): every package imports only from the layers below it.

Imports are read with ``ast`` from every module, lazy (function-level) imports included, with
relative imports resolved, so a violation anywhere in a file is caught.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

import hetsched

PKG = Path(hetsched.__file__).parent
REPO = PKG.parent

# Where each part of the installed package lives (hetsched.backends and hetsched.policies are
# top-level folders of the repository, see package-dir in pyproject.toml).
SOURCES = {"hetsched": PKG, "hetsched.backends": REPO / "backends", "hetsched.policies": REPO / "policies"}

VOCABULARY = {"_errors", "_snapshot", "_events", "_onnxruntime", "_compat"}
SESSION = {"_session", "_core", "_delivery", "_feeds", "_setup", "_profiling", "_stream", "_sync", "_governed",
           "_adapt", "_replan", "_session_stats", "_session_base", "_trace", "_trace_counters", "_trace_writer",
           "_ort_meta", "_ort_session"}

# part -> the hetsched parts it may import (besides itself). A part is the first component
# under hetsched (a subpackage or a module), with backends/sim.py and backends/rknn.py as parts of their own.
ALLOWED: dict[str, set[str]] = {
    "_errors": set(),
    # Python 3.10 stand-ins for the few 3.11 names used (StrEnum, Self, BaseExceptionGroup, add_note).
    "_compat": set(),
    "_snapshot": set(),
    "_onnxruntime": set(),
    "_events": {"_errors", "_compat"},
    "_platform": VOCABULARY,
    # memory below the runtime, shared with backends and toolkit clients (locate_shared, cuda-python)
    "_memory": VOCABULARY,
    "_twin": VOCABULARY,
    "policies": VOCABULARY,
    "backends": VOCABULARY | {"_platform"},
    "backends.sim": VOCABULARY | {"_platform", "_planning", "_twin", "backends"},
    # The RKNN backend drives the toolkit's worker process (_rknn) and, on a twin root, wraps its
    # stages in the twin's modelled-time accounting (backends.sim).
    "backends.rknn": VOCABULARY | {"_platform", "_planning", "_rknn", "_twin", "backends"},
    # The TensorRT backend (backends/tensorrt.py and its backends/_tensorrt_*.py helpers).
    "backends.tensorrt": VOCABULARY | {"_platform", "_memory", "_planning", "backends"},
    # The ncnn backend (backends/ncnn.py and its backends/_ncnn_*.py helpers) prepares stages and
    # measures them as the RKNN backend does (_rknn.prepare, _rknn.accuracy) and, on a twin root,
    # wraps them in the twin's modelled-time accounting (backends.sim).
    "backends.ncnn": VOCABULARY | {"_platform", "_planning", "_rknn", "backends"},
    "_planning": VOCABULARY | {"_platform", "backends", "policies"},
    "_runtime": VOCABULARY | {"_platform", "_memory", "backends"},
    "_rknn": VOCABULARY | {"_platform", "_memory"},
    "_estimators": VOCABULARY | {"_platform", "_twin"},
    "_governor": VOCABULARY | {"_platform", "_estimators", "_twin"},
}


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved, lazy ones included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


@cache
def _modules() -> dict[str, tuple[str, set[str]]]:
    """``file -> (part, imported hetsched parts)`` for every module of the package."""
    out: dict[str, tuple[str, set[str]]] = {}
    for top, folder in SOURCES.items():
        for f in sorted(folder.rglob("*.py")):
            rel = f.relative_to(folder)
            package = ".".join((top, *rel.parent.parts))
            if top == "hetsched":
                part = rel.parts[0].removesuffix(".py")
            else:
                part = top.removeprefix("hetsched.")
                if top == "hetsched.backends" and rel.name in ("sim.py", "rknn.py"):
                    part = f"backends.{rel.stem}"
                elif top == "hetsched.backends" and rel.stem.lstrip("_").startswith("tensorrt"):
                    part = "backends.tensorrt"
                elif top == "hetsched.backends" and rel.stem.lstrip("_").startswith("ncnn"):
                    part = "backends.ncnn"
            used = set()
            for mod in _imports(f, package):
                if mod.startswith("hetsched."):
                    head = mod.split(".")[1]
                    used.add(head)
            used.discard(part.split(".")[0])
            out[str(f.relative_to(REPO))] = (part, used)
    return out


def test_relative_imports_resolve_to_absolute_names(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from .. import _twin\nfrom .._twin.sim import SimBoard\nfrom . import power\n"
                   "def f():\n    import hetsched._cli\n")
    got = _imports(src, "hetsched._platform")
    assert {"hetsched._twin", "hetsched._twin.sim", "hetsched._platform.power", "hetsched._cli"} <= got


def test_every_part_is_classified() -> None:
    parts = {part for part, _ in _modules().values()}
    known = set(ALLOWED) | SESSION | {"__init__", "__main__", "_cli", "lowlevel", "onnx_backend", "train", "testing"}
    assert parts <= known, f"new part(s) {sorted(parts - known)}: give them a layer in ALLOWED / docs/architecture.md"


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_layers_import_only_what_is_below_them(part: str) -> None:
    offenders = {f: sorted(used - ALLOWED[part]) for f, (p, used) in _modules().items() if p == part}
    assert offenders, f"no modules found for {part}"
    assert {f: bad for f, bad in offenders.items() if bad} == {}


def test_the_real_board_layer_never_imports_the_simulator() -> None:
    # The rule most worth its own name: hetsched on a board must not depend on the twin.
    offenders = [f for f, (p, used) in _modules().items() if p in ("_platform", "_planning", "_runtime") and "_twin" in used]
    assert offenders == []


def test_only_the_command_line_imports_the_command_line() -> None:
    offenders = [f for f, (p, used) in _modules().items() if "_cli" in used and p not in ("__main__",)]
    assert offenders == []


def test_the_session_layer_sits_above_the_runtime_never_below() -> None:
    below = set(ALLOWED)
    offenders = {f: sorted(used & SESSION) for f, (p, used) in _modules().items() if p in below and used & SESSION}
    assert offenders == {}


def test_event_loop_libraries_are_imported_only_by_the_loop_modules() -> None:
    loops = PKG / "_runtime" / "_loops"
    offenders = []
    for folder in SOURCES.values():
        for f in folder.rglob("*.py"):
            if loops in f.parents:
                continue
            mods = _imports(f, "hetsched")
            if mods & {"asyncio", "trio", "sniffio"} or any(m.startswith(("asyncio.", "trio.")) for m in mods):
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
    for rel, (part, _) in _modules().items():
        if not (part in SESSION or part == "_runtime") or rel.endswith("_runtime/_clock.py"):
            continue
        tree = ast.parse((REPO / rel).read_text(), rel)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in CLOCK_READS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "time"):
                offenders.append(f"{rel}:{node.lineno}: time.{node.func.attr}()")
    assert not offenders, offenders
