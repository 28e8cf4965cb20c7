"""Start-up (issue 22): ``import hetsched`` and the CLI's board tools do not import onnx or
onnxruntime; the public names import on first use and stay what they were. The figures (how
long) are in benchmarks/startup.py; these tests check which modules load, in fresh interpreters."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import hetsched
import hetsched.lowlevel

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("onnx", "onnxruntime")


def _loaded_after(code: str) -> list[str]:
    """The heavy modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=120)
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_import_hetsched_does_not_import_onnx_or_onnxruntime() -> None:
    assert _loaded_after("import hetsched, hetsched.lowlevel\nhetsched.HetschedError\nhetsched.Phase") == []


def test_the_probe_sees_onnx_when_a_name_needs_it() -> None:
    # The same probe on a name whose module needs onnx: the test above can fail.
    assert "onnx" in _loaded_after("import hetsched\nhetsched.Plan")


def _run_cli(args: list[str]) -> list[str]:
    code = ("import contextlib, io\nfrom hetsched._cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try:\n        rc = main({args!r})\n    except SystemExit as e:\n        rc = e.code\n"
            "assert rc == 0, rc")
    return _loaded_after(code)


@pytest.fixture(scope="module")
def twin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("startup") / "twin"
    subprocess.run([sys.executable, "-m", "hetsched", "twin", "rk3588", "--root", str(root), "--once"],
                   check=True, capture_output=True, timeout=120)
    return root


def test_info_on_a_twin_root_does_not_import_onnx_or_onnxruntime(twin_root: Path) -> None:
    assert _run_cli(["info", "--root", str(twin_root)]) == []
    assert _run_cli(["info", "--root", str(twin_root), "--json"]) == []


@pytest.mark.parametrize("args", [["--help"], ["top", "--help"], ["doctor", "--help"], ["restore", "--help"],
                                  ["twin", "--help"], ["run", "--help"], ["plan", "--help"]])
def test_the_parser_does_not_import_onnx_or_onnxruntime(args: list[str]) -> None:
    assert _run_cli(args) == []


def test_top_and_restore_on_a_twin_root_do_not_import_onnx(twin_root: Path) -> None:
    assert _run_cli(["top", "--root", str(twin_root), "--iterations", "1", "--interval", "0.01"]) == []
    assert _run_cli(["restore", "--root", str(twin_root)]) == []


def _type_checking_imports(path: Path) -> dict[str, str]:
    """``name -> module`` of the imports under ``if TYPE_CHECKING:`` in a module's source."""
    tree = ast.parse(path.read_text())
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "_typing.TYPE_CHECKING"):
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom), ast.unparse(stmt)
                for alias in stmt.names:
                    out[alias.asname or alias.name] = "." * stmt.level + (stmt.module or "")
    return out


@pytest.mark.parametrize("module", [hetsched, hetsched.lowlevel], ids=["hetsched", "lowlevel"])
def test_lazy_table_matches_the_imports_type_checkers_see(module: types.ModuleType) -> None:
    path = Path(module.__file__ or "")
    lazy: dict[str, str] = module._LAZY
    assert _type_checking_imports(path) == lazy
    eager = {n for n in module.__all__ if n not in lazy}
    assert set(lazy) <= set(module.__all__)
    for name in eager:  # the rest is imported at once (hetsched's errors)
        assert name in vars(module), name


def test_public_names_resolve_list_and_star_import_as_before() -> None:
    assert set(hetsched.__all__) <= set(dir(hetsched))
    assert set(hetsched.lowlevel.__all__) <= set(dir(hetsched.lowlevel))
    ns: dict[str, object] = {}
    exec("from hetsched import *", ns)
    assert set(hetsched.__all__) <= set(ns)
    assert hetsched.Session.__module__ == "hetsched"
    assert hetsched.lowlevel.BufferPool.__module__ == "hetsched.lowlevel"
    assert hetsched.lowlevel.BufferPool is hetsched.lowlevel.BufferPool
    with pytest.raises(AttributeError, match="Sesion"):
        hetsched.Sesion  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError, match="nothing"):
        hetsched.lowlevel.nothing  # type: ignore[attr-defined]  # noqa: B018
    # Subpackages stay reachable as attributes after a bare ``import hetsched``.
    _loaded_after("import hetsched\nassert hetsched.lowlevel.GraphIndex\nassert hetsched.backends.Device\n"
                  "assert hetsched.policies.HEFT")

