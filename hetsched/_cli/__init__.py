"""``hetsched`` command line: one module per subcommand, each with ``register(subparsers)``.

A subcommand module defines ``register(subparsers) -> None`` that adds its parser and
sets ``func`` (a callable ``(args) -> int``) with ``parser.set_defaults(func=...)``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hetsched._compat import BaseExceptionGroup
from hetsched._errors import HetschedError

__all__ = ["main"]

# What a user's input or machine can cause (one line, exit 1); anything else is a bug (a traceback).
_USER_ERRORS = (HetschedError, OSError)

# Order is the order of ``hetsched --help``.
_SUBCOMMAND_MODULES = (
    "hetsched._cli._demo",
    "hetsched._cli._plan",
    "hetsched._cli._run",
    "hetsched._cli._info",
    "hetsched._cli._top",
    "hetsched._cli._twin",
    "hetsched._cli._setup",
    "hetsched._cli._compile",
    "hetsched._cli._profile",
    "hetsched._cli._plot",
    "hetsched._cli._doctor",
    "hetsched._cli._restore",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetsched",
        description="Heterogeneous edge SoC runtime: ONNX partitioning, placement, scheduling and DVFS.",
    )
    from hetsched import __version__

    parser.add_argument("--version", action="version", version=f"hetsched {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # A subcommand module not written yet must not break the others.
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; the exit status is returned (argparse exits 2 on a usage error).

    Every error a user can cause is one line on stderr, never a traceback: a bad argument is
    argparse's usage error naming it (exit 2, the validators in ``_common``); a
    :class:`~hetsched.HetschedError` or an ``OSError`` the OS raised (a full disk, a permission)
    is ``hetsched: error: NAME: message`` (exit 1), also when a task group wraps it. Anything
    else is a bug of hetsched's and keeps its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except _USER_ERRORS as exc:
        _report(exc)
        return 1
    except BaseExceptionGroup as group:
        # A subcommand's task group wraps the error; report hetsched's own errors plainly.
        leaves = _leaves(group)
        if leaves and all(isinstance(e, _USER_ERRORS) for e in leaves):
            for e in leaves:
                _report(e)
            return 1
        raise
    except KeyboardInterrupt:
        return 130


def _report(exc: BaseException) -> None:
    print(f"hetsched: error: {type(exc).__name__}: {exc}", file=sys.stderr)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
