"""Helpers shared by CLI subcommands."""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hetsched._errors import CompileError
from hetsched._events import CompileInfo, EventInfo, Hooks

# numpy, onnx and onnxruntime import where a model is loaded, never with the parser: the board
# tools (info, top, doctor, restore, twin) and --help start without them (issue 22).
if TYPE_CHECKING:
    import numpy as np
    import onnx

DEFAULT_MODEL = "light_squeezenet"


# Argument validators (``type=`` of every numeric and path option, in one place): a bad value is
# argparse's one-line usage error naming the option (exit 2), never a traceback later (issue 23).
# tests/test_cli_bad_args.py checks that every numeric option of every subcommand uses one.


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts: requests, repeats, nodes per unit ...)."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive integer (>= 1)")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (warm-up requests, seeds)."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= 0")
    return value


def finite_float(text: str) -> float:
    """Any finite number (no ``nan`` or ``inf``)."""
    return float(_number(text, float))


def positive_float(text: str) -> float:
    """A finite number > 0 (watts, seconds, milliseconds, inches ...)."""
    value = float(_number(text, float))
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive number (> 0)")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (a fraction such as an allowed slowdown)."""
    value = float(_number(text, float))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number >= 0")
    return value


def probability(text: str) -> float:
    """A number in [0, 1]."""
    value = float(_number(text, float))
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a probability in [0, 1]")
    return value


def policy_spec(text: str) -> str:
    """A placement policy name as :func:`hetsched.policies.get_policy` reads it (checked here,
    returned unchanged): ``random:x`` or an unknown name is a usage error."""
    from hetsched._errors import HetschedError
    from hetsched.policies import get_policy

    try:
        get_policy(text)
    except HetschedError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def output_file(text: str) -> str:
    """A file to write: its folder exists and it is not a folder itself."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r}: its folder {str(parent)!r} {what}")
    return text


def output_dir(text: str) -> str:
    """A folder to write into (made if missing): not an existing file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    return text


def existing_dir(text: str) -> str:
    """A folder that exists (a sysfs root, a calibration folder)."""
    path = Path(text)
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {what}")
    return text


def existing_file(text: str) -> str:
    """A file to read: it exists and is not a folder (a FIFO or device is refused where it is read)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    return text


def light_model(name: str) -> Path:
    """A model shipped in the onnx wheel (``light_squeezenet``, ``light_resnet50``, ...)."""
    from hetsched._planning.model import embedded_model

    return embedded_model(name)


def resolve_model_arg(arg: str) -> Path:
    from hetsched._planning.model import model_path

    return model_path(arg)


def default_host_devices() -> list[str]:
    """Each host core alone plus all of them together (at most 4 single cores)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) == 1:
        return [f"cpu:{cpus[0]}"]
    singles = [f"cpu:{c}" for c in cpus[:4]]
    return [*singles, "cpu"]


def add_devices_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", nargs="+", metavar="SPEC",
                   help="device specs: cpu, cpu:N, cpu:N-M, cpu:N,M, big, little, clusters (default: each host "
                        "core plus all cores); on a board (--root DIR of a twin, --soc) also gpu, npu, npu:N, "
                        "dla:N and the board's device names (cluster4, ...); a spec the board lacks is an error "
                        "listing the board's specs")
    p.add_argument("--policy", default="power-thermal", type=policy_spec,
                   help="power-thermal (default), heft, random[:SEED], pinned:DEVICE, or an entry point name")
    p.add_argument("--max-unit-nodes", type=positive_int, default=None, metavar="N",
                   help="cut unit subgraphs to at most N nodes")


def add_shape_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="fix input NAME's shape (free dimensions) for backends that need static shapes and for "
                        "the random inputs; repeatable")


def parse_shapes(items: Sequence[str], prog: str) -> dict[str, tuple[int, ...]]:
    """``["x=1,3,224,224"]`` -> ``{"x": (1, 3, 224, 224)}``; exits with a clear message otherwise."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            parsed = tuple(int(d) for d in dims.split(","))
        except ValueError:
            parsed = ()
        if not sep or not name or not parsed or any(d < 1 for d in parsed):
            raise SystemExit(f"{prog}: --shape {item!r}: expected NAME=D0,D1,... with positive integer dimensions")
        shapes[name] = parsed
    return shapes


def require_shapes(model: str | os.PathLike[str], shapes: dict[str, tuple[int, ...]], prog: str) -> None:
    """Before anything runs: the CLI makes up inputs and estimates at the shapes it feeds, so a
    model input with free dims that ``--shape`` leaves free is an error naming each such input
    and the ``--shape`` to pass (:class:`~hetsched.FreeDimsError`, printed as one line).

    :raises FreeDimsError: free dims remain.
    :raises InputError: a ``--shape`` names no input or contradicts the model.
    """
    from hetsched._planning.graph import GraphIndex
    from hetsched._planning.model import load_model, with_input_shapes
    from hetsched._session._feeds import require_fixed_shapes

    loaded = load_model(model, check=False, infer_shapes=not shapes)
    require_fixed_shapes(GraphIndex(with_input_shapes(loaded, shapes) if shapes else loaded), prog)


def board_devices(root: str) -> list[Any]:
    """Simulated devices of the board whose tree is under ``root`` (SoC from the tree itself).

    :raises UnknownSocError: the tree names no SoC hetsched knows.
    """
    from hetsched._errors import UnknownSocError
    from hetsched._platform import discover
    from hetsched.backends.sim import clock_from_root, twin_devices

    soc = discover(root).soc
    if soc is None:
        raise UnknownSocError(f"no known SoC in the tree under {root!r} (device-tree compatible / "
                              "nv_tegra_release); write one with 'hetsched twin SOC --root DIR --once'")
    return twin_devices(soc, clock=clock_from_root(root), root=root)


def select_devices(specs: Sequence[str] | None, root: str | None) -> list[Any]:
    """The devices of ``--devices`` / ``--root``.

    Without ``root``, or with the host's ``/``: ``specs`` as the device resolver reads them on this
    host (default: each host core plus all of them); never a simulator on a real board. With a
    board's tree (a twin's root): the resolver's board devices, ``specs`` picking some of them
    (default: every cluster, the GPU, the DLA cores and the RK3588 NPU when its toolkit exists;
    ``hetsched plan`` prints why one is left out).

    :raises DeviceSpecError: a spec the host or the board lacks (the message lists the board's specs).
    :raises UnknownSocError: ``root`` is not ``/`` and holds no known SoC.
    """
    from hetsched._devices.board import board_soc
    from hetsched._devices.resolve import resolve_devices
    from hetsched._platform import SysfsRoot

    if root is None or SysfsRoot(root).is_host_root:
        return list(specs or default_host_devices())
    if board_soc(SysfsRoot(root)) is None:
        from hetsched._errors import UnknownSocError

        raise UnknownSocError(f"no known SoC in the tree under {root!r} (device-tree compatible / "
                              "nv_tegra_release); write one with 'hetsched twin SOC --root DIR --once'")
    return resolve_devices(list(specs) if specs else None, root=root)


def soc_devices(soc: str, specs: Sequence[str] | None) -> list[Any]:
    """The devices of ``--soc SOC`` (a twin with no tree), ``specs`` picking some of them as on a
    board root; ``npu`` is the twin's simulated NPU (one device: its cores need a twin's tree,
    ``--root``), ``cpu:LIST`` the host's cores.

    :raises UnknownSocError: unknown ``soc``.
    :raises DeviceSpecError: a spec the board lacks (the message lists its specs), or duplicates.
    """
    from hetsched._devices.board import BoardRoot, resolve_board_spec
    from hetsched._devices.resolve import NPU_SPECS, resolve_devices
    from hetsched._errors import DeviceSpecError
    from hetsched.backends.sim import twin_devices

    twins = twin_devices(soc)
    if not specs:
        return twins
    sim_npu = next((d for d in twins if d.kind == "npu"), None)

    def npu(spec: str) -> Any:
        if spec != "npu" or sim_npu is None:
            raise DeviceSpecError(f"device spec {spec!r}: --soc {soc} simulates the NPU as one device, 'npu'; "
                                  f"its cores are the RKNN backend's on a twin's tree (hetsched twin {soc} --root DIR "
                                  "--once, then --root DIR)")
        return sim_npu

    board = BoardRoot(soc=soc, root="", twins=tuple(twins), npu=npu if sim_npu is not None else None,
                      label=f"of --soc {soc}")
    out: list[Any] = []
    for spec in specs:
        s = spec.strip().lower()
        if s.startswith("cpu:"):
            out.extend(resolve_devices([spec]))
        else:
            out.extend(resolve_board_spec(spec, s, board, tuple(NPU_SPECS)))
    names = [d.name for d in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DeviceSpecError(f"duplicate devices: {dupes}")
    return out


def stage_rows(plan: Any) -> list[dict[str, Any]]:
    """The plan's stages as the CLI's JSON contract lists them (name, device, backend, nodes, flops, ...)."""
    keys = ("id", "name", "device", "backend", "nodes", "flops", "units", "deps", "estimated_s")
    return [{k: st[k] for k in keys} for st in plan.to_json()["stages"]]


def reference_outputs(model: Path, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
    """The model's outputs for ``feeds`` from bare onnxruntime on the host (CPU provider)."""
    from hetsched._onnxruntime import ort_session

    sess = ort_session(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def compare_outputs(reference: dict[str, np.ndarray], got: dict[str, Any]) -> dict[str, Any]:
    """``max_abs_diff`` (over every element of every output) and ``min_cosine`` (the least
    cosine similarity of one output, flattened, with its reference; 1.0 for two zero vectors),
    and ``outputs``: each output's own ``cosine`` and ``max_abs_diff`` (an INT8 run against fp32)."""
    import numpy as np

    max_abs = 0.0
    min_cos = 1.0
    per: dict[str, dict[str, float]] = {}
    for name, ref in reference.items():
        a = np.asarray(got[name], dtype=np.float64).ravel()
        b = np.asarray(ref, dtype=np.float64).ravel()
        if a.shape != b.shape:
            return {"max_abs_diff": float("inf"), "min_cosine": -1.0, "outputs": per}
        diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        max_abs = max(max_abs, diff)
        na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
        if na == 0.0 or nb == 0.0:
            cos = 1.0 if na == nb else 0.0
        else:
            cos = float(np.dot(a, b) / (na * nb))
        min_cos = min(min_cos, cos)
        per[name] = {"cosine": cos, "max_abs_diff": diff}
    return {"max_abs_diff": max_abs, "min_cosine": min_cos, "outputs": per}


def random_feeds(session_inputs: Sequence[onnx.ValueInfoProto], seed: int = 0,
                 shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """Random inputs: a free dimension is 1 unless ``shapes`` fixes the input's shape."""
    import numpy as np
    import onnx.helper

    rng = np.random.default_rng(seed)
    feeds: dict[str, Any] = {}
    for vi in session_inputs:
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim]
        if shapes and vi.name in shapes:
            dims = list(shapes[vi.name])
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if dt.kind == "f":
            feeds[vi.name] = rng.standard_normal(dims).astype(dt)
        else:
            feeds[vi.name] = rng.integers(0, 4, dims).astype(dt)
    return feeds


def format_duration(seconds: float) -> str:
    """``4.2 s`` under 10 s, ``42 s`` under a minute, ``1:05`` under an hour, else ``1:02:03``."""
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    whole = round(s)
    h, rest = divmod(whole, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    """A one-line progress bar with an ETA on stderr (only when stderr is a terminal or forced)::

        [#########.....................] 3/10 requests  1.2 s, ETA 2.8 s
        [##############################] 10/10 requests in 4.0 s

    The ETA is the mean time per item since the bar was made times the items left (``--``
    before the first one). Redraws at most every ``min_interval_s`` (the last item always).
    ``clock`` and ``stream`` are injected for tests; ``total`` may grow (:meth:`advance_to`).
    """

    def __init__(self, total: int, *, enabled: bool | None = None, label: str = "requests",
                 clock: Callable[[], float] = time.monotonic, stream: TextIO | None = None,
                 min_interval_s: float = 0.1):
        self.total = total
        self._stream = stream
        self.enabled = (stream or sys.stderr).isatty() if enabled is None else enabled
        self.label = label
        self.done = 0
        self._clock = clock
        self._t0 = clock()
        self._min_interval_s = min_interval_s
        self._last: float | None = None
        self._finished = False

    def eta_s(self) -> float | None:
        """Seconds left at the mean rate so far; None before the first item."""
        if self.done <= 0:
            return None
        elapsed = self._clock() - self._t0
        return elapsed / self.done * max(0, self.total - self.done)

    def line(self) -> str:
        """The bar as it reads now (no carriage return)."""
        width = 30
        filled = min(width, int(width * self.done / max(1, self.total)))
        head = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {self.label}"
        elapsed = self._clock() - self._t0
        if self.done >= self.total:
            return f"{head} in {format_duration(elapsed)}"
        eta = self.eta_s()
        return f"{head}  {format_duration(elapsed)}, ETA {'--' if eta is None else format_duration(eta)}"

    def update(self, n: int = 1) -> None:
        self.advance_to(self.done + n, self.total)

    def advance_to(self, done: int, total: int) -> None:
        """Set the count and the total (a :data:`hetsched._session._profiling.ProgressCallback`)."""
        self.done, self.total = done, total
        if not self.enabled or self._finished:
            return
        now = self._clock()
        last = self.done >= self.total
        if not last and self._last is not None and now - self._last < self._min_interval_s:
            return
        self._last = now
        stream = self._stream or sys.stderr
        # pad with spaces: a shorter line must cover the end of the one it overwrites
        stream.write(f"\r{self.line():<78}")
        if last:
            self._finished = True
            stream.write("\n")
        stream.flush()


class CompileProgress(Hooks):
    """Session hooks printing one line per stage compile on stderr once compiling runs long:
    ``compiling k/n NAME on DEVICE: S s (ETA E s)`` (``cached`` for a cache hit, ``failed`` /
    ``refused`` for a compile that raised; ``trying`` for the unit trials after a refusal).

    Lines start at the first compile that ends ``after_s`` or more after the first one began
    (0: from the first), so a quick compile of host stages prints nothing. ``k`` counts the
    compiles ended in the current batch (a plan's stages, or one round of trials) and the ETA
    is the batch's mean so far times the compiles left. Thread-safe (compiles run in parallel);
    ``clock`` is injected for tests.
    """

    def __init__(self, *, after_s: float = 0.5, clock: Callable[[], float] = time.perf_counter,
                 stream: TextIO | None = None) -> None:
        self.after_s = after_s
        self._clock = clock
        self._stream = stream
        self._lock = threading.Lock()
        self._first: float | None = None
        self._loud = False
        self._batch_t0 = 0.0
        self._total = 0
        self._done = 0
        self._trial = False

    def before_compile(self, info: EventInfo) -> None:
        ci = info.extra
        assert isinstance(ci, CompileInfo)
        with self._lock:
            now = self._clock()
            if self._first is None:
                self._first = now
            if self._done >= self._total or (ci.total, ci.trial) != (self._total, self._trial):
                self._batch_t0, self._total, self._done, self._trial = now, ci.total, 0, ci.trial

    def after_compile(self, info: EventInfo) -> None:
        ci = info.extra
        assert isinstance(ci, CompileInfo)
        with self._lock:
            now = self._clock()
            self._done += 1
            if not self._loud:
                self._loud = self._first is not None and now - self._first >= self.after_s
                if not self._loud:
                    return
            done, total = min(self._done, self._total), max(self._total, 1)
            eta = (now - self._batch_t0) / max(done, 1) * (total - done)
            if info.error is not None:
                what = "refused" if isinstance(info.error, CompileError) else f"failed ({type(info.error).__name__})"
            elif ci.cached:
                what = "cached"
            else:
                what = f"{ci.seconds or 0.0:.1f} s"
            kind = "trying" if ci.trial else "compiling"
            stream = self._stream or sys.stderr
            stream.write(f"{kind} {done}/{total} {ci.stage} on {ci.device}: {what} (ETA {eta:.0f} s)\n")
            stream.flush()


def add_compile_progress_args(p: argparse.ArgumentParser, *, progress_flag: bool = True) -> None:
    """``--quiet`` (no compile progress lines) and, with ``progress_flag``, ``--progress``."""
    p.add_argument("--quiet", action="store_true", help="print no compile progress lines on stderr")
    if progress_flag:
        p.add_argument("--progress", action="store_true",
                       help="print a line per stage compile on stderr from the first one (default: once "
                            "compiling takes over 0.5 s)")


def compile_progress_hooks(args: argparse.Namespace) -> list[Hooks]:
    """The session hooks of ``--quiet`` / ``--progress``: a :class:`CompileProgress`, or none."""
    if getattr(args, "quiet", False):
        return []
    return [CompileProgress(after_s=0.0 if getattr(args, "progress", False) else 0.5)]
