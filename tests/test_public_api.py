"""The public surface: one ``__all__``, one exception tree, typed package, README/CI agreement."""

from __future__ import annotations

import importlib
import importlib.resources
import importlib.util
import inspect
import re
import sys
import types
from pathlib import Path

import pytest

import hetsched
import hetsched._errors as errors
import hetsched.backends
import hetsched.policies

ROOT = Path(__file__).resolve().parent.parent


def _public_names(module: types.ModuleType) -> set[str]:
    # dir(), not vars(): public names import on first use (issue 22), so vars() holds only those used.
    return {
        name for name in dir(module)
        if not name.startswith("_") and not isinstance(getattr(module, name), types.ModuleType)
    }


def test_all_is_a_sorted_tuple_of_every_public_name() -> None:
    assert isinstance(hetsched.__all__, tuple)
    assert list(hetsched.__all__) == sorted(set(hetsched.__all__))
    assert set(hetsched.__all__) == _public_names(hetsched)


def test_every_public_name_resolves() -> None:
    for name in hetsched.__all__:
        assert getattr(hetsched, name) is not None, name
    ns: dict[str, object] = {}
    exec("from hetsched import *", ns)
    assert set(hetsched.__all__) <= set(ns)


def test_public_classes_show_the_top_level_module() -> None:
    wrong = {
        name: obj.__module__ for name in hetsched.__all__
        if inspect.isclass(obj := getattr(hetsched, name)) and obj.__module__ != "hetsched"
    }
    assert not wrong, wrong


def _tree_names() -> list[str]:
    doc = errors.__doc__ or ""
    return re.findall(r"^[\s│├└─]*([A-Z][A-Za-z]+Error)\b", doc, flags=re.MULTILINE)


def test_every_exception_subclasses_hetsched_error_and_is_in_the_tree() -> None:
    tree = _tree_names()
    assert tree[0] == "HetschedError"
    assert len(tree) == len(set(tree)), "an exception appears twice in the docstring tree"
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert inspect.isclass(cls) and issubclass(cls, errors.HetschedError), name
        assert name in tree, f"{name} is missing from the tree in hetsched._errors' docstring"
    assert set(tree) == set(errors.__all__), "the tree names exceptions that do not exist"


def test_tree_indentation_matches_the_class_hierarchy() -> None:
    doc = errors.__doc__ or ""
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        m = re.match(r"^(\s*(?:[│ ]   |[├└]── )*)([A-Z][A-Za-z]+Error)\b", line)
        if not m:
            continue
        depth = len(m.group(1))
        name = m.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parent = getattr(errors, stack[-1][1])
            assert issubclass(getattr(errors, name), parent), f"{name} should subclass {stack[-1][1]}"
        stack.append((depth, name))


def test_every_exception_is_exported_at_the_top_level() -> None:
    missing = [n for n in errors.__all__ if n not in hetsched.__all__]
    assert not missing, missing


def test_exceptions_with_builtin_bases() -> None:
    assert issubclass(hetsched.ModelNotFoundError, FileNotFoundError)
    assert issubclass(hetsched.InputError, ValueError)
    assert issubclass(hetsched.BackendUnavailableError, ImportError)
    err = hetsched.PartitionError("x", op_types=["B", "A"], devices=["cpu:0"])
    assert (err.op_types, err.devices) == (["B", "A"], ["cpu:0"])


def test_subpackages_all_resolve() -> None:
    for module in (hetsched.backends, hetsched.policies):
        assert module.__all__
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
        assert len(module.__all__) == len(set(module.__all__))


def test_py_typed_is_installed() -> None:
    marker = importlib.resources.files("hetsched") / "py.typed"
    assert marker.is_file()
    spec = importlib.util.find_spec("hetsched")
    assert spec is not None and spec.origin is not None
    assert (Path(spec.origin).parent / "py.typed").is_file()


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second() -> None:
    readme = (ROOT / "README.md").read_text()
    title, _, rest = readme.partition("\n")
    assert title.startswith("# ")
    m = re.match(r"\s*```bash\n([^\n`]+)\n```\s*\n```bash\n([^\n`]+)\n```\n", rest)
    assert m, "README must begin (after the title) with two fenced bash blocks of one command each"
    install_demo, install_test = m.group(1).strip(), m.group(2).strip()
    assert "pip install" in install_demo and install_demo.endswith("hetsched demo")
    assert "pip install" in install_test and "pytest" in install_test
    # A new user's test run exercises Rockchip's real toolkit and simulator too: the toolkit's own
    # environment is made before pytest runs (its tests skip only when it is missing).
    assert "hetsched setup rknn" in install_test
    assert install_test.index("hetsched setup rknn") < install_test.index("pytest")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    ci_commands = [line.strip() for line in ci if line.strip() and not line.lstrip().startswith("#")]
    assert ci_commands[-1] == install_test


def test_version_matches_pyproject() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: tomllib's parent package
        tomllib = pytest.importorskip("tomli")

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert hetsched.__version__ == meta["project"]["version"]


def test_readme_tour_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The README's Python tour is what new users paste first: it must run as written.
    import runpy
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    start = text.index("```python\nimport anyio") + len("```python\n")
    script = tmp_path / "tour.py"
    script.write_text(text[start : text.index("```", start)])
    runpy.run_path(str(script), run_name="__main__")
    assert "stage0" in capsys.readouterr().out


def _private_imports(path: Path) -> list[str]:
    """Every import in ``path`` of a ``hetsched._*`` module or of a ``_``-prefixed name from hetsched."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            names = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] != "hetsched":
                continue
            if any(p.startswith("_") for p in parts[1:]):
                found.append(f"{path.name}:{node.lineno}: {module}")
            found += [f"{path.name}:{node.lineno}: {module}.{n}" for n in names if n.startswith("_")]
    return found


def test_private_import_check_sees_private_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import hetsched._twin.sim\nfrom hetsched._governor import Governor\nfrom hetsched.lowlevel import _x\n"
        "from hetsched import Governor, lowlevel\nimport numpy._core\nfrom . import _local\n"
    )
    assert _private_imports(probe) == [
        "probe.py:1: hetsched._twin.sim",
        "probe.py:2: hetsched._governor",
        "probe.py:3: hetsched.lowlevel._x",
    ]


def test_examples_and_benchmarks_import_only_public_names() -> None:
    files = sorted((ROOT / "examples").glob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    assert files
    bad = [hit for path in files for hit in _private_imports(path)]
    assert not bad, bad


def test_lowlevel_all_is_a_sorted_tuple_shown_as_lowlevel() -> None:
    import hetsched.lowlevel as lowlevel

    assert isinstance(lowlevel.__all__, tuple)
    assert list(lowlevel.__all__) == sorted(set(lowlevel.__all__))
    assert set(lowlevel.__all__) == _public_names(lowlevel)
    wrong = {
        name: obj.__module__ for name in lowlevel.__all__
        if (inspect.isclass(obj := getattr(lowlevel, name)) or inspect.isfunction(obj))
        and obj.__module__ != "hetsched.lowlevel"
    }
    assert not wrong, wrong


def test_governor_extension_points_are_public() -> None:
    # What a user needs to run the governor on a board hetsched has no profile for.
    for name in ("ClockPort", "DomainSpec", "GovernorEngine", "Measurement", "PhaseModel"):
        assert name in hetsched.__all__, name
        assert getattr(hetsched, name).__module__ == "hetsched", name
    assert "port" in inspect.signature(hetsched.Governor).parameters
    assert ":param port:" in (hetsched.Governor.__doc__ or "")
