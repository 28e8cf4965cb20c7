"""The wheel and the sdist as a user gets them (issue 22).

Both are built from a scratch copy of the project's files (no ``build/`` leftovers, no editable
finder), each is installed into a fresh venv outside the checkout, and from there every module of
the package is imported and the command line runs: the demo, a twin snapshot, ``info`` and a plan
on the twin's root. The venv holds only hetsched; its dependencies (onnx, onnxruntime, numpy,
anyio, pyudev) are the ones this interpreter already has, seen through a ``.pth`` line, so the
check needs no network.

An installed module list that differs from the source tree's (a subpackage left out of the wheel,
data a module needs, ``py.typed``) fails here, and so does a module that imports on the checkout
only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import onnx
import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[1]
# Where each part of the installed package lives in the checkout (package-dir in pyproject.toml).
SOURCES = {"hetsched": REPO / "hetsched", "hetsched.backends": REPO / "backends", "hetsched.policies": REPO / "policies"}
PROJECT_FILES = ("pyproject.toml", "setup.py", "README.md")
# Modules that are programs, not libraries: importing them would run them. They must still be installed.
PROGRAMS = {"hetsched.__main__", "hetsched._cli.__main__", "hetsched._rknn._worker_main"}
DEPS_SITE = Path(onnx.__file__).resolve().parents[1]  # the site-packages that holds hetsched's dependencies


def _source_modules() -> set[str]:
    out: set[str] = set()
    for top, folder in SOURCES.items():
        for f in folder.rglob("*.py"):
            rel = f.relative_to(folder).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out.add(".".join((top, *parts)))
    return out


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel, built by setuptools from a clean copy of the project's files."""
    src = tmp_path_factory.mktemp("src")
    junk = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("hetsched", "backends", "policies"):
        shutil.copytree(REPO / folder, src / folder, ignore=junk)
    for name in PROJECT_FILES:
        shutil.copy2(REPO / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    built = {}
    for kind in ("sdist", "wheel"):  # one process each, as a build frontend does
        build = f"import sys; from setuptools import build_meta as b; print('BUILT', b.build_{kind}(sys.argv[1]))"
        lines = _run([sys.executable, "-c", build, str(out)], cwd=src).splitlines()
        built[kind] = out / [line.split()[1] for line in lines if line.startswith("BUILT ")][-1]
        assert built[kind].is_file(), (kind, sorted(out.iterdir()))
    return built


def _fresh_venv(where: Path) -> Path:
    """A venv with no packages of its own; hetsched's dependencies are visible through a .pth line."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(where)], cwd=where.parent)
    python = where / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        cwd=where).strip())
    # Appended after the venv's own site-packages, and a path named in a .pth has its own .pth files
    # (the checkout's editable finder among them) left unprocessed: hetsched comes from the venv.
    (purelib / "_hetsched_test_deps.pth").write_text(f"{DEPS_SITE}\n")
    return python


IMPORT_ALL = """
import importlib, json, pathlib, sys
import hetsched
root = pathlib.Path(hetsched.__file__).parent
names = set()
for f in root.rglob("*.py"):
    parts = f.relative_to(root).with_suffix("").parts
    names.add(".".join(("hetsched", *(parts[:-1] if parts[-1] == "__init__" else parts))))
programs = set(sys.argv[1].split(","))
for name in sorted(names - programs):
    importlib.import_module(name)
from importlib.metadata import distribution, entry_points
print(json.dumps({"file": hetsched.__file__, "modules": sorted(names), "typed": (root / "py.typed").is_file(),
                  "version": distribution("hetsched").version,
                  "policies": sorted(e.name for e in entry_points(group="hetsched.policies"))}))
"""


def _install_and_import(kind: str, dist: Path, tmp: Path) -> tuple[Path, dict[str, object]]:
    python = _fresh_venv(tmp / f"venv-{kind}")
    # --no-build-isolation: setuptools comes from this interpreter (the sdist is built without network)
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
          "--no-build-isolation", "--quiet", str(dist)], cwd=tmp)
    got = json.loads(_run([str(python), "-I", "-c", IMPORT_ALL, ",".join(sorted(PROGRAMS))], cwd=tmp)
                     .splitlines()[-1])
    assert Path(str(got["file"])).is_relative_to(tmp / f"venv-{kind}"), got["file"]  # not the checkout
    return python, got


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_every_module_installs_and_imports(kind: str, dists: dict[str, Path], tmp_path: Path) -> None:
    _, got = _install_and_import(kind, dists[kind], tmp_path)
    assert set(got["modules"]) == _source_modules()  # type: ignore[call-overload]
    assert got["typed"] is True
    assert got["version"] == "0.1.0"
    assert {"power-thermal", "heft", "pinned", "random"} <= set(got["policies"])  # type: ignore[call-overload]


def test_the_installed_command_line_runs_outside_the_checkout(dists: dict[str, Path], tmp_path: Path) -> None:
    python, _ = _install_and_import("wheel", dists["wheel"], tmp_path)
    exe = str(python.parent / "hetsched")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    demo = _run([exe, "demo"], cwd=tmp_path, env=env)
    assert "outputs match onnxruntime" in demo
    twin = tmp_path / "twin"
    _run([exe, "twin", "rk3588", "--root", str(twin), "--once"], cwd=tmp_path, env=env)
    info = _run([exe, "info", "--root", str(twin)], cwd=tmp_path, env=env)
    assert "rk3588" in info.lower()
    plan = json.loads(_run([exe, "plan", "light_squeezenet", "--root", str(twin), "--devices", "big", "little",
                            "--json"], cwd=tmp_path, env=env))
    clusters = {d["name"] for d in plan["devices"] if d["role"] in ("big", "little")}
    assert plan["stages"] and {s["device"] for s in plan["stages"]} <= clusters, plan


def test_the_wheel_holds_nothing_but_the_package(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = whl.namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"hetsched", "hetsched-0.1.0.dist-info"}
    assert "hetsched/py.typed" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_extras_name_nothing_pypi_cannot_install_on_a_board(dists: dict[str, Path]) -> None:
    # What `pip install hetsched[...]` reads: the wheel's own metadata. (.ci/check_extras resolves
    # every extra against PyPI for linux aarch64; this is the part that needs no network.)
    with zipfile.ZipFile(dists["wheel"]) as whl:
        meta = whl.read("hetsched-0.1.0.dist-info/METADATA").decode()
    fields = [line.split(": ", 1) for line in meta.splitlines() if ": " in line]
    assert ["Requires-Python", ">=3.10"] in fields
    reqs = [Requirement(v) for k, v in fields if k == "Requires-Dist"]
    by_name: dict[str, list[Requirement]] = {}
    for r in reqs:
        by_name.setdefault(r.name, []).append(r)
    assert "tensorrt" not in by_name  # PyPI's tensorrt is a source-only stub; JetPack ships the bindings
    for r in by_name["cuda-python"]:  # a newer CUDA major than the board's driver fails every call
        assert any(s.operator == "<" for s in r.specifier), r
    extras = {v for k, v in fields if k == "Provides-Extra"}
    assert {"jetson-cuda12", "jetson-cuda13", "rknn"} <= extras and "tensorrt" not in extras
    backports = {r.name: str(r.marker) for r in reqs if r.name in ("exceptiongroup", "typing_extensions")}
    assert backports == {"exceptiongroup": 'python_version < "3.11"', "typing_extensions": 'python_version < "3.11"'}
