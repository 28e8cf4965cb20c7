"""``hetsched profile MODEL``: time every node and unit on each device, and say why each unit sits where it is.

Steps: open a session on the devices (the plan of the analytic costs); time each unit alone
on each of its candidates (:func:`time_units`: CPU devices through onnxruntime's own profiler,
so per node as well; a twin's simulated devices by the twin's modelled seconds; other
backends, such as the RKNN NPU, per stage only); then ``Session.profile()`` measures the cost
table and re-plans with it, as ``hetsched plan --profile`` does; the report explains the final
plan (:mod:`hetsched._cli._profile_report`).

``--json`` prints one object: ``units`` (per unit: ``nodes``, ``op_types``, ``candidates``,
``seconds`` and ``source`` per device (``measured`` / ``modelled``), ``node_sum_s``,
``planned_s`` (the cost the planner used), ``device`` (chosen), ``why``, ``decided_by``,
``not_on``, ``scores``, ``refused``, ``errors``), ``nodes`` (per node: ``unit``, ``op_type``,
``seconds`` per device where measured, ``no_kernel``: devices where onnxruntime fused or
folded it away), ``costs`` (the cost table), ``devices``, ``stages`` and ``notes``. A progress
bar with an ETA goes to stderr when it is a terminal (``--progress`` forces it; never with
``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from ._common import (
    Progress,
    add_devices_args,
    add_shape_arg,
    compile_progress_hooks,
    existing_dir,
    parse_shapes,
    positive_int,
    random_feeds,
    require_shapes,
    resolve_model_arg,
    select_devices,
)

# onnx, onnxruntime and the planner (through _profile_report) import when a profile runs, not
# with the parser (issue 22: ``hetsched --help`` and the board tools start without them).
if TYPE_CHECKING:
    import onnx

    from ._profile_report import UnitTiming

_NO_PER_LAYER = ("per-layer times are not available for {dev} ({backend}): rknn-toolkit2's eval_perf "
                 "report is not offered through its simulator path here; its units show stage-level times")
_MODELLED = ("{dev} is simulated (backend sim): its times are the SoC twin's modelled seconds at the tree's "
             "clocks, per unit (no per-node times)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("profile", help="time each node and unit on each device; the cost table; why each unit "
                                       "sits where it is")
    p.add_argument("model", help="path to an .onnx file, or an embedded model name (e.g. light_squeezenet)")
    add_devices_args(p)
    p.add_argument("--root", metavar="DIR", type=existing_dir, help="profile on the board whose sysfs tree is under DIR (a twin's "
                   "root): its devices, simulated (modelled times); with --devices, some of them (gpu, big, ...)")
    add_shape_arg(p)
    p.add_argument("--repeats", type=positive_int, default=5, metavar="N",
                   help="timed runs per unit and device, after one warm-up (default 5)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--progress", action="store_true", help="force the progress bar (default: when stderr is a terminal)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=main)


def _tagged(model: onnx.ModelProto, node_ids: tuple[int, ...]) -> onnx.ModelProto:
    """``model`` (a stage: its nodes in ``node_ids`` order) with each node named by :func:`node_tag`."""
    import onnx

    from ._profile_report import node_tag

    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node, nid in zip(out.graph.node, node_ids, strict=True):
        node.name = node_tag(nid)
    return out


def _time_cpu(backend: Any, model: onnx.ModelProto, node_ids: tuple[int, ...], dev: Any,
              feeds: Mapping[str, Any], repeats: int, uid: int) -> tuple[UnitTiming, dict[str, Any]]:
    """One unit through onnxruntime's profiler on a CPU device (the backend's session options,
    pinned to its cores); layout transforms are off so that kernels keep their nodes' names.

    :raises CompileError: onnxruntime could not load the stage.
    :raises StageExecutionError: a run raised.
    """
    import onnxruntime as ort

    from hetsched._errors import CompileError, StageExecutionError
    from hetsched._onnxruntime import ort_session
    from hetsched._platform.affinity import pin_current_thread
    from hetsched._platform.files import read_regular_file

    from ._profile_report import UnitTiming, median_run, parse_ort_profile

    so = backend.session_options(dev)
    so.enable_profiling = True
    extended = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if so.graph_optimization_level not in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                           ort.GraphOptimizationLevel.ORT_ENABLE_BASIC):
        so.graph_optimization_level = extended
    with tempfile.TemporaryDirectory(prefix="hetsched-profile-") as tmp:
        so.profile_file_prefix = str(Path(tmp) / f"unit{uid}")
        try:
            sess = ort_session(_tagged(model, node_ids).SerializeToString(), sess_options=so,
                                        providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise CompileError(f"onnxruntime could not compile unit {uid} for {dev.name!r}: {exc}") from exc
        names = [o.name for o in sess.get_outputs()]
        prev = pin_current_thread(dev.cpus)
        try:
            out: list[Any] = []
            for _ in range(1 + max(1, repeats)):
                out = sess.run(names, dict(feeds))
        except Exception as exc:
            raise StageExecutionError(f"unit {uid} raised on {dev.name!r}: {exc}") from exc
        finally:
            if prev is not None:
                os.sched_setaffinity(0, prev)
            path = sess.end_profiling()
        values = dict(zip(names, out, strict=True))
        try:  # onnxruntime wrote it into our scratch directory: still read only a regular file, bounded
            events = json.loads(read_regular_file(path, what="onnxruntime profile"))
        except (OSError, ValueError) as exc:  # NotRegularFileError, a truncated or unreadable profile
            return UnitTiming(uid, dev.name, None, error=f"onnxruntime's profile could not be read: {exc}"), values
    run = median_run(parse_ort_profile(events))
    if run is None:
        return UnitTiming(uid, dev.name, None, error="onnxruntime's profile has no model_run"), values
    return UnitTiming(uid, dev.name, run.seconds, "measured", dict(run.nodes), sum(run.other.values())), values


def _time_backend(model: onnx.ModelProto, dev: Any, feeds: Mapping[str, Any], repeats: int,
                  uid: int) -> tuple[UnitTiming, dict[str, Any]]:
    """One unit through its device's backend: the stage's own modelled seconds where it
    reports them (``last_run_seconds``: a twin's stage), else the wall time of its runs.

    :raises BackendError: the backend could not compile or run it.
    """
    import time

    from hetsched._platform.affinity import pin_current_thread
    from hetsched.backends import get_backend

    from ._profile_report import UnitTiming

    compiled = get_backend(dev.backend).compile(model, dev, name=f"unit{uid}")
    prev = pin_current_thread(dev.cpus)
    try:
        modelled = compiled.hooks.modelled  # a twin stage knows its modelled seconds per run
        times: list[float] = []
        out: list[Any] = list(compiled.run(dict(feeds)))  # warm-up
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            out = list(compiled.run(dict(feeds)))
            times.append(float(modelled.last_run_seconds()) if modelled is not None else time.perf_counter() - t0)
        outputs = dict(zip(compiled.output_names, out, strict=False))
    finally:
        if prev is not None:
            os.sched_setaffinity(0, prev)
        compiled.close()
    times.sort()
    return (UnitTiming(uid, dev.name, times[len(times) // 2], "modelled" if modelled is not None else "measured"),
            outputs)


def time_units(index: Any, plan: Any, feeds: Mapping[str, Any], repeats: int,
               progress: Callable[[int, int], None] | None = None) -> list[UnitTiming]:
    """Each unit of ``plan`` alone on each of its candidates, in topological order; a unit's
    inputs are the outputs its producers gave on their first device that ran them. A failure
    is recorded (``error``) and the others go on. Blocking: call it from a worker thread."""
    from hetsched._errors import HetschedError
    from hetsched._planning.partition import extract_stage
    from hetsched._session._profiling import unit_stage_specs
    from hetsched.backends import get_backend
    from hetsched.backends.cpu import CpuBackend

    from ._profile_report import UnitTiming

    by_name = {d.name: d for d in plan.devices}
    specs = unit_stage_specs(index, plan)
    total = sum(len(plan.units[s.units[0]].candidates) for s in specs)
    done = 0
    if progress is not None:
        progress(done, total)
    values: dict[str, Any] = dict(feeds)
    timings: list[UnitTiming] = []
    for spec in specs:
        uid = spec.units[0]
        model = extract_stage(index, spec)
        node_ids = (*spec.rematerialized, *spec.nodes)
        missing = [n for n in spec.inputs if n not in values]
        produced = False
        for dname in plan.units[uid].candidates:
            dev = by_name[dname]
            if missing:
                timings.append(UnitTiming(uid, dname, None, error=f"inputs {missing} not computed (a producer failed)"))
            else:
                stage_feeds = {n: values[n] for n in spec.inputs}
                try:
                    backend = get_backend(dev.backend)
                    if isinstance(backend, CpuBackend):
                        timing, out = _time_cpu(backend, model, node_ids, dev, stage_feeds, repeats, uid)
                    else:
                        timing, out = _time_backend(model, dev, stage_feeds, repeats, uid)
                except HetschedError as exc:
                    timing, out = UnitTiming(uid, dname, None, error=f"{type(exc).__name__}: {exc}"), {}
                timings.append(timing)
                if out and not produced:
                    values.update(out)
                    produced = True
            done += 1
            if progress is not None:
                progress(done, total)
    return timings


def main(args: argparse.Namespace) -> int:
    from hetsched import Session
    from hetsched.backends import get_backend

    from ._profile_report import build_report, capability_gap, format_report

    shapes = parse_shapes(args.shape, "hetsched profile")
    require_shapes(resolve_model_arg(args.model), shapes, "hetsched profile's inputs")
    devices = select_devices(args.devices, args.root)
    notes: list[str] = []
    if args.root and not args.devices:
        from hetsched._devices.resolve import board_device_notes

        notes.extend(board_device_notes(args.root))
    enabled = False if args.json or args.quiet else (True if args.progress else None)
    loud = enabled is not False and (enabled or sys.stderr.isatty())
    hooks = compile_progress_hooks(args) if loud else []

    async def go() -> int:
        async with Session(resolve_model_arg(args.model), devices=devices, policy=args.policy,
                           max_unit_nodes=args.max_unit_nodes, root=args.root or "/", shapes=shapes,
                           hooks=hooks) as s:
            index = s._require_index()  # the session's graph (its fixed shapes), as the planner saw it
            feeds = random_feeds(s.get_inputs(), shapes=shapes)
            first = s.plan
            timing_bar = Progress(0, enabled=enabled, label="unit runs (per node)")
            timings = await anyio.to_thread.run_sync(time_units, index, first, feeds, args.repeats,
                                                     timing_bar.advance_to)
            cost_bar = Progress(0, enabled=enabled, label="unit runs (cost table)")
            costs = await s.profile(feeds, repeats=args.repeats, progress=cost_bar.advance_to)
            plan = s.plan
            gaps: dict[int, dict[str, tuple[str, str]]] = {}
            caps = {d.name: get_backend(d.backend).capabilities(d) for d in plan.devices}
            for u in plan.units:
                for d in plan.devices:
                    if d.name not in u.candidates:
                        gap = capability_gap(index, plan.unit_nodes[u.id], caps[d.name])
                        if gap is not None:
                            gaps.setdefault(u.id, {})[d.name] = gap
            for d in plan.devices:
                if d.backend == "sim":
                    notes.append(_MODELLED.format(dev=d.name))
                elif d.backend != "cpu":
                    notes.append(_NO_PER_LAYER.format(dev=d.name, backend=d.backend))
            if any(d.backend == "cpu" for d in plan.devices):
                notes.append("per-node times come from onnxruntime's profiler with its layout transforms off "
                             "(kernels keep their nodes' names); a node fused into another has no kernel of its own")
            report = build_report(index, plan, timings, costs.to_json(), gaps, notes)
            print(json.dumps(report, indent=1) if args.json else format_report(report))
        return 0

    return anyio.run(go)
