"""Layering: the board and planning layers import nothing from the layers built on them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hetsched

PKG = Path(hetsched.__file__).parent
ABOVE = ("_runtime", "_twin", "_governor", "_session", "_cli")


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


def _layer(name: str) -> dict[str, set[str]]:
    files = sorted((PKG / name).rglob("*.py"))
    assert files, f"no modules under hetsched/{name}"
    return {str(f.relative_to(PKG)): _imports(f, ".".join(("hetsched", *f.parent.relative_to(PKG).parts))) for f in files}


def test_relative_imports_resolve_to_absolute_names(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from .. import _twin\nfrom .._twin.sim import SimBoard\nfrom . import power\n"
                   "def f():\n    import hetsched._cli\n")
    got = _imports(src, "hetsched._platform")
    assert {"hetsched._twin", "hetsched._twin.sim", "hetsched._platform.power", "hetsched._cli"} <= got


def test_platform_imports_nothing_from_the_twin() -> None:
    offenders = {f: sorted(m for m in mods if m.startswith("hetsched._twin")) for f, mods in _layer("_platform").items()}
    assert {f: m for f, m in offenders.items() if m} == {}


@pytest.mark.parametrize("layer", ["_platform", "_planning"])
def test_lower_layers_do_not_import_upper_ones(layer: str) -> None:
    banned = tuple(f"hetsched.{name}" for name in ABOVE)
    offenders = {
        f: sorted(m for m in mods if m in banned or m.startswith(tuple(b + "." for b in banned)))
        for f, mods in _layer(layer).items()
    }
    assert {f: m for f, m in offenders.items() if m} == {}
