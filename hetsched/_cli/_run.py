"""``hetsched run MODEL``: run requests through a model and report latency and throughput.

``--json`` prints one object (the CLI's contract, checked by tests): ``model``, ``requests``,
``inputs`` (the fed shapes), ``stages`` (a list: ``name``, ``device``, ``backend``, ``nodes`` (a count), ``flops`` (analytic),
...), ``refused`` (units a backend refused, with its reason), ``compile`` (``conversions``,
``cache_hits``, ``seconds``: summed over the session's backends that count them in their
``statistics()``, since the session opened; zeros for backends that do not, such as ``cpu``),
latency/throughput figures, ``replans`` (``count``, ``last_reason``, ``reasons``), ``energy``
(``joules``, ``source``, ``mj_per_request``) where the devices report it, and with ``--check`` ``check`` (``max_abs_diff``, ``min_cosine``
of every output against bare onnxruntime on the host for the same inputs). Stdout holds only
that; compile progress lines go to stderr (see :class:`hetsched._cli._common.CompileProgress`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import anyio
import anyio.abc
import numpy as np

from ._common import (
    Progress,
    add_compile_progress_args,
    add_devices_args,
    add_shape_arg,
    compare_outputs,
    compile_progress_hooks,
    parse_shapes,
    random_feeds,
    reference_outputs,
    resolve_model_arg,
    select_devices,
    stage_rows,
)
from ._compile import add_int8_args, calibration_arg, with_accuracy


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run requests through a model (random inputs)")
    p.add_argument("model", help="path to an .onnx file, or an embedded model name")
    add_devices_args(p)
    p.add_argument("--requests", type=int, default=20, metavar="N", help="number of requests (default 20)")
    p.add_argument("--concurrency", type=int, default=1, metavar="K", help="requests in flight at once")
    p.add_argument("--stream", action="store_true",
                   help="feed the requests as one stream (Session.map: workers admit the next request, results "
                        "come in batches): throughput only, no per-request latency")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--progress", action="store_true",
                   help="force the progress bar, and print a line per stage compile from the first one")
    add_compile_progress_args(p, progress_flag=False)
    p.add_argument("--root", metavar="DIR", help="run on the board whose sysfs tree is under DIR (a twin's root): "
                   "its devices are simulated (the RK3588 NPU is the RKNN backend's), stages report modelled "
                   "time and energy at the tree's clocks; with --devices, some of them (gpu, npu:0, dla:1, big, "
                   "cluster4, ...); --root / is this host's real cores")
    p.add_argument("--trace", metavar="PATH",
                   help="write a Chrome trace event JSON file of the run (open it in https://ui.perfetto.dev or "
                        "chrome://tracing): stage runs per device thread, requests, transfers, governor phases, "
                        "re-plans and, with --root, clock/temperature/power counters; closed also on SIGTERM/SIGINT")
    add_shape_arg(p)
    add_int8_args(p)
    p.add_argument("--check", action="store_true",
                   help="compare every output with bare onnxruntime on the host for the same inputs")
    g = p.add_argument_group("DVFS governor (needs --root, or root privileges on a real board with --root /)")
    g.add_argument("--governor", choices=("none", "phase"), default="none",
                   help="phase: hetsched's phase-aware governor sets the board's clocks per inference phase and "
                        "restores every knob at the end, also on SIGTERM/SIGINT")
    g.add_argument("--slowdown", type=float, default=0.05, metavar="F", help="allowed slowdown (default 0.05)")
    g.add_argument("--power-budget", type=float, default=None, metavar="W", help="hard power cap in watts")
    g.add_argument("--frame-deadline-ms", type=float, default=None, metavar="MS",
                   help="frame-paced work: one request's phases may take up to MS (instead of --slowdown); "
                        "the governor finds the least energy that still meets it")
    g.add_argument("--governor-profile", metavar="PATH",
                   help="JSON profile to load if it exists, and to save what auto-tune learned to")
    g.add_argument("--dry-run", action="store_true", help="decide and log clock changes, write nothing")
    p.set_defaults(func=main)


async def run_requests(session: object, feeds: dict, n: int, concurrency: int, progress: Progress) -> list[float]:
    """``n`` requests, ``concurrency`` at a time (a fixed pool of tasks, so cancelling is instant)."""
    latencies: list[float] = []
    remaining = [n]

    async def worker() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            t0 = time.perf_counter()
            await session.run(feeds)  # type: ignore[attr-defined]
            latencies.append(time.perf_counter() - t0)
            progress.update()

    async with anyio.create_task_group() as tg:
        for _ in range(max(1, min(concurrency, n))):
            tg.start_soon(worker)
    return latencies


async def stream_requests(session: object, feeds: dict, n: int, progress: Progress) -> int:
    """``n`` requests as one stream (``Session.map``); returns how many results came back."""
    done = 0
    async with session.map(feeds for _ in range(n)) as results:  # type: ignore[attr-defined]
        async for _ in results:
            done += 1
            progress.update()
    return done


def modelled_rows(session: Any) -> list[dict]:
    rows = []
    devices = {st.name: st.device for st in session.plan.stages}
    for name, x in session.stage_statistics().items():
        if x is None or not hasattr(x, "modelled_time_s"):
            continue  # a stage that runs for real models no time or energy
        if x.runs:
            rows.append({"stage": name, "device": devices[name], "runs": x.runs,
                         "time_ms_per_run": x.modelled_time_s / x.runs * 1e3,
                         "energy_mj_per_run": x.modelled_energy_j / x.runs * 1e3})
    return rows


def print_modelled(rows: list[dict], what: str) -> None:
    print(f"\nSIMULATED {what} (SoC twin; tensors computed for real by onnxruntime on this host):")
    print(f"{'stage':8} {'device':10} {'modelled ms/run':>16} {'modelled mJ/run':>16}")
    tot_t = tot_e = 0.0
    for row in rows:
        tot_t += row["time_ms_per_run"]
        tot_e += row["energy_mj_per_run"]
        print(f"{row['stage']:8} {row['device']:10} {row['time_ms_per_run']:16.3f} {row['energy_mj_per_run']:16.3f}")
    print(f"{'total':8} {'':10} {tot_t:16.3f} {tot_e:16.3f}  (serial sum per request)")


def governor_statistics(hooks: list) -> dict:
    for h in hooks:
        gov = getattr(h, "governor", None)
        if gov is not None:
            st = gov.statistics()
            return {"phase_switches": st.phase_switches, "decisions": st.decisions, "writes": st.writes,
                    "writes_avoided": st.writes_avoided, "locked_domains": list(st.locked_domains),
                    "dry_run": st.dry_run, "ungoverned": st.ungoverned}
    return {}


def main(args: argparse.Namespace) -> int:
    from hetsched import Session

    if args.requests < 1:
        raise SystemExit("hetsched run: --requests must be >= 1")

    shapes = parse_shapes(args.shape, "hetsched run")
    calibration = calibration_arg(args, resolve_model_arg(args.model), "hetsched run")
    devices = select_devices(args.devices, args.root)

    if args.governor != "none" and not args.root:
        raise SystemExit("hetsched run: --governor needs --root DIR (use --root / on a real board)")
    signalled: list[int] = []

    async def serve(hooks: list) -> int:
        async with Session(resolve_model_arg(args.model), devices=devices, policy=args.policy,
                           max_unit_nodes=args.max_unit_nodes, root=args.root or "/",
                           hooks=[*hooks, *compile_progress_hooks(args)],
                           shapes=shapes, calibration=calibration, trace=args.trace) as s:
            feeds = random_feeds(s.get_inputs(), shapes=shapes)
            progress = Progress(args.requests, enabled=True if args.progress else None)
            t0 = time.perf_counter()
            if args.stream:
                done = await stream_requests(s, feeds, args.requests, progress)
                wall = time.perf_counter() - t0
                summary: dict = {"model": str(args.model), "stages": with_accuracy(s, stage_rows(s.plan)), "requests": done,
                                 "mode": "stream", "throughput_rps": done / wall}
            else:
                lat = await run_requests(s, feeds, args.requests, args.concurrency, progress)
                wall = time.perf_counter() - t0
                summary = {
                    "model": str(args.model), "stages": with_accuracy(s, stage_rows(s.plan)), "requests": len(lat),
                    "latency_ms_median": statistics.median(lat) * 1e3,
                    "latency_ms_p99": sorted(lat)[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3,
                    "throughput_rps": len(lat) / wall,
                }
            summary["inputs"] = {name: list(np.shape(v)) for name, v in feeds.items()}
            summary["refused"] = s.plan.to_json()["refused"]
            comp = s.statistics().compile
            summary["compile"] = {"conversions": comp.conversions, "cache_hits": comp.cache_hits,
                                  "seconds": comp.seconds}
            if args.check:
                reference = await anyio.to_thread.run_sync(reference_outputs, resolve_model_arg(args.model), feeds)
                summary["check"] = compare_outputs(reference, await s.run(feeds))
            modelled = modelled_rows(s)
            if modelled:
                summary["modelled"] = modelled
            st = s.statistics()
            summary["replans"] = {"count": st.replanning.replans, "last_reason": st.replanning.last_reason,
                                  "reasons": dict(st.replanning.reasons)}
            if st.energy_j is not None and summary["requests"]:
                summary["energy"] = {"joules": st.energy_j, "source": st.energy_source,
                                     "mj_per_request": st.energy_j / summary["requests"] * 1e3}
            gov_stats = governor_statistics(hooks)
            if gov_stats:
                summary["governor"] = gov_stats
            if args.json:
                print(json.dumps(summary))
            else:
                print(s.plan.table())
                if args.stream:
                    print(f"{summary['requests']} requests streamed: {summary['throughput_rps']:.1f} req/s")
                else:
                    print(f"{summary['requests']} requests: median {summary['latency_ms_median']:.2f} ms, "
                          f"p99 {summary['latency_ms_p99']:.2f} ms, {summary['throughput_rps']:.1f} req/s")
                if args.check:
                    print(f"check vs onnxruntime: max |diff| {summary['check']['max_abs_diff']:.3g}, "
                          f"min cosine {summary['check']['min_cosine']:.6f}")
                if modelled:
                    print_modelled(modelled, f"board under {args.root}")
                if st.replanning.replans:
                    print(f"re-planned {st.replanning.replans} time(s) while serving; last: {st.replanning.last_reason}")
                if "energy" in summary:
                    print(f"energy: {summary['energy']['mj_per_request']:.3f} mJ per request "
                          f"({summary['energy']['source']}, every stage run, re-planned ones included)")
        return 0


    async def governed() -> int:
        from pathlib import Path

        from hetsched._governed import GovernorHooks
        from hetsched._governor import Governor, GovernorConfig

        profile_path = Path(args.governor_profile) if args.governor_profile else None
        deadline = None if args.frame_deadline_ms is None else args.frame_deadline_ms / 1e3
        gov = Governor(
            args.root, config=GovernorConfig(slowdown=args.slowdown, power_budget_w=args.power_budget,
                                             loop_deadline_s=deadline),
            profile=profile_path if profile_path is not None and profile_path.exists() else None,
            workload=Path(str(args.model)).stem, dry_run=args.dry_run, handle_signals=False,
        )
        # The governor restores every knob when this block exits: normally, on error, or
        # when the signal watcher below cancels the run (restore runs shielded).
        async with gov:
            hooks = GovernorHooks(gov)

            rc = await serve([hooks])
            if profile_path is not None:
                gov.profile().save(profile_path)
        return rc

    async def go() -> int:
        import signal

        rc = 0
        async with anyio.create_task_group() as tg:

            async def watch(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    task_status.started()
                    # Keep receiving until the run has unwound: a second signal must not fall
                    # through to the default handler and kill us before the clocks are restored.
                    async for signum in signals:
                        if not signalled:
                            signalled.append(int(signum))
                            tg.cancel_scope.cancel()

            await tg.start(watch)
            rc = await (governed() if args.governor != "none" else serve([]))
            tg.cancel_scope.cancel()
        if signalled:
            print(f"hetsched run: stopped by signal {signalled[0]}; clocks restored", file=sys.stderr)
            return 128 + signalled[0]
        return rc

    return anyio.run(go)
