"""``hetsched setup rknn [--torch SPEC] [--python PY] [--dir DIR]``: make an SDK's environment."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ._common import output_dir

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "setup",
        help="create the separate environment an accelerator SDK needs (rknn: rknn-toolkit2)",
        description="Create or update the environment an accelerator SDK runs in, apart from hetsched's own.",
    )
    sdks = parser.add_subparsers(dest="sdk", metavar="SDK", required=True)
    from hetsched._rknn.env import DEFAULT_TORCH, TOOLKIT_VERSION

    rknn = sdks.add_parser(
        "rknn",
        help=f"rknn-toolkit2 {TOOLKIT_VERSION} (converter and simulator) in its own venv",
        description=(
            f"Create a venv with rknn-toolkit2 {TOOLKIT_VERSION} and its pinned dependencies "
            "(numpy<=1.26.4, onnx<=1.18, protobuf<=4.25.4), which cannot share hetsched's environment. "
            "pip's output goes to setup.log in the environment's directory. A second setup of the same "
            "directory waits for the first and then finds the environment ready; an interrupted setup "
            "leaves it unready, and the next setup rebuilds it."
        ),
    )
    rknn.add_argument("--torch", default=DEFAULT_TORCH, metavar="SPEC",
                      help=f"the torch requirement (default: the toolkit's pin {DEFAULT_TORCH!r})")
    rknn.add_argument("--python", default=sys.executable, metavar="PY",
                      help="interpreter to make the venv from, Python 3.8-3.12 (default: this one)")
    rknn.add_argument("--dir", default=None, metavar="DIR", type=output_dir,
                      help="where to create it (default: $XDG_CACHE_HOME/hetsched/rknn-toolkit2-VERSION)")
    rknn.set_defaults(func=run_rknn)


def run_rknn(args: argparse.Namespace) -> int:
    from hetsched._rknn.env import ENV_VARIABLE, SetupProgress, setup_toolkit_env, toolkit_env_dir

    t0 = time.monotonic()

    def show(p: SetupProgress) -> None:
        head = f"[{p.index}/{p.total}] {p.step}"
        if p.status == "waiting":
            who = f" (pid {p.holder})" if p.holder is not None else ""
            print(f"another `hetsched setup rknn`{who} is setting up this environment; waiting for it to finish",
                  flush=True)
        elif p.status == "start":
            eta = f" (about {p.expected_s:.0f} s; {p.remaining_s:.0f} s left in all)" if p.expected_s is not None and (
                p.remaining_s is not None) else ""
            print(f"{head}{eta} ...", end="", flush=True)
        elif p.status == "skipped":
            print(f"{head}: already done", flush=True)
        else:
            print(f" done ({p.seconds:.1f} s)", flush=True)

    try:
        env_dir = setup_toolkit_env(torch=args.torch, python=args.python, directory=args.dir, progress=show)
    except BaseException:
        print(" failed", flush=True)
        raise
    python = env_dir / "bin" / "python"
    print(f"RKNN toolkit environment ready in {time.monotonic() - t0:.1f} s: {env_dir}")
    if args.dir is None or env_dir.resolve() == toolkit_env_dir().resolve():
        print("hetsched finds it there by itself.")
    else:
        print(f"hetsched finds it with: export {ENV_VARIABLE}={python}")
    return 0
