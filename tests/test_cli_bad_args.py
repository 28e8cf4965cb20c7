"""Bad CLI arguments (issue 23, items 6 and 12): every subcommand, every option, bad values.

The options are enumerated from the parsers themselves, so an option added later is covered:
every numeric option must declare its domain with one of the validators in
``hetsched._cli._common`` (a bare ``int``/``float`` fails :func:`test_every_numeric_option_has_a_domain`),
and each domain's bad values must each be one usage error (exit 2) naming the option, with no
traceback. Path options are run for real with a missing path, a folder where a file belongs, a
file where a folder belongs: each ends in one line (exit 1 or 2), never a traceback.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from hetsched._cli import _common, build_parser, main

# Each domain's invalid values (all rejected at parse time) and one valid value.
BAD_VALUES: dict[Callable[[str], Any], tuple[str, ...]] = {
    _common.positive_int: ("0", "-5", "x", "nan", "inf", "1.5"),
    _common.non_negative_int: ("-5", "x", "nan", "inf", "1.5"),
    _common.positive_float: ("0", "-5", "x", "nan", "inf", "-inf"),
    _common.non_negative_float: ("-5", "x", "nan", "inf"),
    _common.finite_float: ("x", "nan", "inf", "-inf"),
    _common.probability: ("-0.5", "1.5", "x", "nan", "inf"),
    _common.policy_spec: ("random:x", "random:1.5", "pinned:", "no-such-policy"),
}
PATH_TYPES = (_common.existing_dir, _common.existing_file, _common.output_dir, _common.output_file)

# Positionals a subcommand needs before its options are parsed (any valid value).
POSITIONALS = {"model": "light_squeezenet", "more_models": "light_shufflenet", "soc": "rk3588", "trace": "t.json"}
# Options a subcommand requires (a valid value each), filled in per test (tmp paths).
REQUIRED = {"out", "output", "root"}


def _subparsers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
                ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from _subparsers(sub, (*prefix, name))
                else:
                    yield (*prefix, name), sub


COMMANDS = dict(_subparsers(build_parser()))


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _base_argv(command: tuple[str, ...], parser: argparse.ArgumentParser, tmp: Path, skip: str = "") -> list[str]:
    """``command`` with its positionals and required options at valid values."""
    argv = list(command)
    for a in parser._actions:
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction) and a.dest != "help":
            argv.append(POSITIONALS[a.dest])
    for a in _options(parser):
        if a.required and a.dest != skip:
            assert a.dest in REQUIRED, f"{command}: a valid value for required {a.option_strings}"
            argv += [a.option_strings[-1], str(tmp / a.dest) if a.dest != "root" else str(tmp)]
    return argv


def test_every_numeric_option_has_a_domain() -> None:
    plain = [(cmd, a.option_strings) for cmd, p in COMMANDS.items() for a in _options(p)
             if a.type is not None and a.type not in BAD_VALUES and a.type not in PATH_TYPES]
    assert not plain, f"options without a validator from hetsched._cli._common (int/float take nan, -5 ...): {plain}"


NUMERIC_CASES = [
    pytest.param(cmd, a.option_strings[-1], bad, id=f"{' '.join(cmd)} {a.option_strings[-1]} {bad}")
    for cmd, p in COMMANDS.items() for a in _options(p) if a.type in BAD_VALUES
    for bad in BAD_VALUES[a.type]
]


def test_the_cases_cover_the_options_of_the_issue() -> None:
    ids = {(cast("list[str]", c.values[0])[0], c.values[1]) for c in NUMERIC_CASES}
    for case in [("run", "--policy"), ("run", "--max-unit-nodes"), ("demo", "--requests"), ("run", "--concurrency"),
                 ("run", "--power-budget"), ("plan", "--max-unit-nodes"), ("twin", "--flaky")]:
        assert case in ids, case


@pytest.mark.parametrize(("command", "option", "bad"), NUMERIC_CASES)
def test_a_bad_number_is_one_usage_error_naming_the_option(command: tuple[str, ...], option: str, bad: str,
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*_base_argv(command, COMMANDS[command], tmp_path), f"{option}={bad}"]
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"hetsched {' '.join(command)}: error: argument ") and option in last, err
    assert repr(bad) in last or bad in last, last


def _bad_paths(kind: Callable[[str], str], tmp: Path) -> dict[str, Path]:
    a_file = tmp / "a_file"
    a_file.write_text("not what was asked for\n")
    a_dir = tmp / "a_dir"
    a_dir.mkdir()
    missing = tmp / "missing" / "x"
    if kind is _common.existing_dir:
        return {"missing": missing, "file": a_file}
    if kind is _common.existing_file:
        return {"missing": missing, "dir": a_dir}
    if kind is _common.output_dir:
        return {"file": a_file}
    return {"missing-folder": missing, "dir": a_dir}  # output_file


PATH_CASES = [
    pytest.param(cmd, a.option_strings[-1], a.dest, a.type, label,
                 id=f"{' '.join(cmd)} {a.option_strings[-1]} {label}")
    for cmd, p in COMMANDS.items() for a in _options(p) if a.type in PATH_TYPES
    for label in ({"existing_dir": ("missing", "file"), "existing_file": ("missing", "dir"),
                   "output_dir": ("file",), "output_file": ("missing-folder", "dir")}[a.type.__name__])
]


@pytest.mark.parametrize(("command", "option", "dest", "kind", "label"), PATH_CASES)
def test_a_bad_path_is_one_usage_error_naming_the_option(command: tuple[str, ...], option: str, dest: str,
                                                        kind: Callable[[str], str], label: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = _bad_paths(kind, tmp_path)[label]
    argv = [*_base_argv(command, COMMANDS[command], tmp_path, skip=dest), option, str(bad)]
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"hetsched {' '.join(command)}: error: argument ") and option in last, err
    assert str(bad) in last, err


@pytest.mark.parametrize("command", ["run", "plan", "profile"])
def test_a_missing_model_is_one_line(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (tmp_path / "missing.onnx", tmp_path):
        assert main([command, str(bad)]) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and str(bad) in err, err


@pytest.mark.parametrize("bad", ["missing", "dir", "not-json"])
def test_plot_of_a_bad_trace_is_one_line(bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = {"missing": tmp_path / "missing.json", "dir": tmp_path}.get(bad, tmp_path / "t.json")
    if bad == "not-json":
        trace.write_text("{not json")
    assert main(["plot", str(trace), "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and str(trace) in err, err


def test_a_calibration_sample_of_the_wrong_shape_is_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "0.npy", np.zeros((1, 3, 10, 10), np.float32))  # light_squeezenet takes 1x3x224x224
    for command in ("run", "plan"):
        assert main([command, "light_squeezenet", "--int8", "--calibration", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "--calibration" in err and "[1, 3, 10, 10]" in err and "[1, 3, 224, 224]" in err, err
    out = tmp_path / "out"
    assert main(["compile", "light_squeezenet", "--int8", "--calibration", str(tmp_path), "--out", str(out)]) == 1
    assert "InputError" in capsys.readouterr().err


def test_compile_out_naming_an_existing_file_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "manifest"
    out.write_text("mine\n")
    with pytest.raises(SystemExit) as info:
        main(["compile", "light_squeezenet", "--out", str(out)])
    assert info.value.code == 2
    assert "--out" in capsys.readouterr().err
    assert out.read_text() == "mine\n"


def test_policy_random_x_is_a_hetsched_error_in_the_library_too() -> None:
    from hetsched import PlacementError
    from hetsched.policies import get_policy

    with pytest.raises(PlacementError, match="random:x"):
        get_policy("random:x")


# A few through the installed command, as a user runs it (the in-process cases cover the rest).
@pytest.mark.parametrize("argv", [
    ["run", "light_squeezenet", "--policy", "random:x"],
    ["run", "light_squeezenet", "--power-budget", "inf"],
    ["run", "light_squeezenet", "--concurrency", "-3"],
    ["demo", "--requests", "-1"],
    ["run", "light_squeezenet", "--trace", "/nonexistent-folder/t.json"],
], ids=lambda a: " ".join(a[-2:]))
def test_the_installed_command_prints_no_traceback(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "hetsched", *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert f"error: argument {argv[-2]}" in out.stderr.strip().splitlines()[-1]
