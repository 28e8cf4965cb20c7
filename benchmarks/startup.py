"""Start-up: how long ``import hetsched`` and the board tools of the CLI take (issue 22).

Every figure is one fresh interpreter (a subprocess), so nothing is cached in this process;
the runs of the different cases alternate, so a burst of load on a shared host falls on all
of them alike, and each figure is the median over ``--runs`` runs:

* ``import_hetsched_s`` / ``import_onnxruntime_s``: wall time of the import statement alone,
  timed inside the child (interpreter start-up excluded); ``import_ratio`` is their ratio
  (target <= 1.0: importing hetsched costs no more than importing onnxruntime, which every
  hetsched session needs anyway). ``*_cpu_s`` are the same in the child's CPU time (what other
  processes on a loaded host cannot add to), ``import_ratio_cpu`` their ratio.
* ``import_full_s``: ``import hetsched`` followed by ``hetsched.Session`` (what a program that
  runs a model pays at its first session; shown so the cost is seen moved, not gone).
* ``info_cpu_s`` / ``info_wall_s``: the whole ``hetsched info --root TWIN`` process (interpreter
  start-up included), CPU time (user + system, from ``wait4``) and wall time; TWIN is a tree
  written by ``hetsched twin SOC --root DIR --once`` (target: ``info_cpu_s <= 0.5``).
* ``help_cpu_s`` / ``help_wall_s``: the whole ``hetsched --help`` process.
* ``modules``: whether onnx / onnxruntime / numpy were imported by ``import hetsched`` and by
  ``hetsched info`` (read from ``sys.modules`` in the child).

The last line printed is one JSON object.

Usage: ``python benchmarks/startup.py [--runs N] [--soc rk3588]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _labels import host, labelled, measured

TIMED_IMPORT = (
    "import time as _t\n"
    "_w, _c = _t.perf_counter(), _t.process_time()\n"
    "{stmt}\n"
    "_w, _c = _t.perf_counter() - _w, _t.process_time() - _c\n"
    "import json, sys\n"
    "print(json.dumps({{'wall': _w, 'cpu': _c, 'modules': sorted(m for m in ('onnx', 'onnxruntime', 'numpy') "
    "if m in sys.modules)}}))\n"
)
HEAVY = ("onnx", "onnxruntime", "numpy")


def _cli() -> list[str]:
    """The ``hetsched`` console script next to this interpreter (what a user runs), else ``-m``."""
    script = Path(sys.executable).with_name("hetsched")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hetsched"]


def timed_import(stmt: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", TIMED_IMPORT.format(stmt=stmt)], check=True,
                         capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def timed_process(argv: list[str]) -> dict[str, float]:
    """Wall time and CPU time (user + system, of the process and its children) of one run."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {err.strip()[-400:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime}


def info_modules(root: str) -> list[str]:
    """The heavy modules in ``sys.modules`` after ``hetsched info --root ROOT`` (run in-process in a child)."""
    code = ("import contextlib, io, sys\nfrom hetsched._cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    rc = main(['info', '--root', {root!r}])\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\nsys.exit(rc)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    modules: list[str] = json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"'))
    return modules


def measure(runs: int, soc: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="hetsched-startup-"))
    try:
        root = str(tmp / "twin")
        made = subprocess.run([*_cli(), "twin", soc, "--root", root, "--once"], capture_output=True, text=True)
        if made.returncode != 0:
            raise SystemExit(f"hetsched twin {soc} --root {root} --once exited {made.returncode}: {made.stderr.strip()}")
        cases: dict[str, list[dict[str, Any]]] = {k: [] for k in ("hetsched", "onnxruntime", "full", "info", "help")}
        for _ in range(runs):
            cases["hetsched"].append(timed_import("import hetsched"))
            cases["onnxruntime"].append(timed_import("import onnxruntime"))
            cases["full"].append(timed_import("import hetsched\nhetsched.Session"))
            cases["info"].append(timed_process([*_cli(), "info", "--root", root]))
            cases["help"].append(timed_process([*_cli(), "--help"]))
        med = {k: {f: statistics.median(r[f] for r in v) for f in ("wall", "cpu")} for k, v in cases.items()}
        return {"median": med, "modules": {"import hetsched": cases["hetsched"][0]["modules"],
                                           "hetsched info": info_modules(root)}}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="runs per case (median; default 7)")
    ap.add_argument("--soc", default="rk3588", help="the twin whose tree 'hetsched info' reads (default rk3588)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs {args.runs}: must be >= 1")
    res = measure(args.runs, args.soc)
    m = res["median"]
    for case, figures in m.items():
        print(f"{case}: wall {figures['wall']:.3f} s, cpu {figures['cpu']:.3f} s", file=sys.stderr)
    ratio = m["hetsched"]["wall"] / m["onnxruntime"]["wall"]
    ratio_cpu = m["hetsched"]["cpu"] / m["onnxruntime"]["cpu"]
    out: dict[str, Any] = {
        "benchmark": "startup",
        "runs": args.runs,
        "twin": args.soc,
        "import_ratio": round(ratio, 3),
        "import_ratio_cpu": round(ratio_cpu, 3),
        "import_hetsched_s": round(m["hetsched"]["wall"], 4),
        "import_onnxruntime_s": round(m["onnxruntime"]["wall"], 4),
        "import_hetsched_cpu_s": round(m["hetsched"]["cpu"], 4),
        "import_onnxruntime_cpu_s": round(m["onnxruntime"]["cpu"], 4),
        "import_full_s": round(m["full"]["wall"], 4),
        "info_cpu_s": round(m["info"]["cpu"], 4),
        "info_wall_s": round(m["info"]["wall"], 4),
        "help_cpu_s": round(m["help"]["cpu"], 4),
        "help_wall_s": round(m["help"]["wall"], 4),
        "modules": res["modules"],
        "target": {"import_ratio": 1.0, "info_cpu_s": 0.5},
        "meets_target": ratio <= 1.0 and m["info"]["cpu"] <= 0.5,
    }
    print(json.dumps(labelled(out, board=host(), figures=measured("wall and CPU time of fresh interpreters"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
