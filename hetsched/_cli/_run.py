"""``hetsched run MODEL``: run requests through a model and report latency and throughput.

``hetsched run A.onnx B.onnx --rate 30,0 --priority high,background --slo-ms 33,-`` (or
``--workload FILE``) serves several models at once: :mod:`hetsched._cli._run_multi`.

``--json`` prints one object (the CLI's contract, checked by tests): ``model``, ``requests``,
``inputs`` (the fed shapes), ``stages`` (a list: ``name``, ``device``, ``backend``, ``nodes`` (a count), ``flops`` (analytic),
...), ``refused`` (units a backend refused, with its reason), ``compile`` (``conversions``,
``cache_hits``, ``seconds``: summed over the session's backends that count them in their
``statistics()``, since the session opened; zeros for backends that do not, such as ``cpu``),
latency/throughput figures, ``replans`` (``count``, ``last_reason``, ``reasons``), ``energy``
(``joules``, ``source``, ``mj_per_request``) where the devices report it, and with ``--check`` ``check`` (``max_abs_diff``, ``min_cosine``
of every output against bare onnxruntime on the host for the same inputs).

Two energies: ``energy_j`` / ``energy_per_request_j`` are the *stage* energy (each stage's modelled
joules at its device's clocks, the session's figure); ``board_energy_j`` /
``board_energy_per_request_j`` are the *board's* (with ``--root``: the root's measured board-input
rail, ``VDD_IN`` on a Jetson, integrated over the requests, the idle between frames included;
``board_energy_source`` ``"measured: VDD_IN"``), what a power meter on the board's input shows and
what a governor is judged by. Where the root has no measured board rail (RK3588 boards have no power
monitor) they are null and ``board_energy_note`` says why. Stdout holds only
that; compile progress lines go to stderr (see :class:`hetsched._cli._common.CompileProgress`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from ._common import (
    Progress,
    add_compile_progress_args,
    add_devices_args,
    add_shape_arg,
    compare_outputs,
    compile_progress_hooks,
    existing_dir,
    existing_file,
    non_negative_float,
    non_negative_int,
    output_file,
    parse_shapes,
    positive_float,
    positive_int,
    random_feeds,
    reference_outputs,
    require_shapes,
    resolve_model_arg,
    select_devices,
    stage_rows,
)
from ._compile import add_int8_args, calibration_arg, with_accuracy
from ._run_governed import (
    BoardEnergy,
    governor_summary,
    paced_requests,
    print_governor_summary,
    run_governed,
    sampled,
)
from ._run_multi import add_multi_args, is_multi, run_multi

WARMUP_REQUESTS = 3
"""``hetsched run --warmup``'s default: requests run before the measured ones (issue 24)."""

def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run requests through a model (random inputs)")
    p.add_argument("model", nargs="?", help="path to an .onnx file, or an embedded model name")
    add_multi_args(p)
    add_devices_args(p)
    p.add_argument("--requests", type=positive_int, default=20, metavar="N", help="number of requests (default 20)")
    p.add_argument("--concurrency", type=positive_int, default=1, metavar="K", help="requests in flight at once")
    p.add_argument("--warmup", type=non_negative_int, default=WARMUP_REQUESTS, metavar="N",
                   help=f"requests run first and left out of the latency figures (toolkit contexts starting, "
                        f"caches filling; default {WARMUP_REQUESTS}, like trtexec's --warmUp)")
    p.add_argument("--stream", action="store_true",
                   help="feed the requests as one stream (Session.map: workers admit the next request, results "
                        "come in batches): throughput only, no per-request latency")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary: energy_per_request_j is the stages' modelled energy, "
                        "board_energy_per_request_j the board's (with --root: its measured input rail, VDD_IN, over "
                        "the run, idle between frames included; null with board_energy_note where it has none)")
    p.add_argument("--progress", action="store_true",
                   help="force the progress bar, and print a line per stage compile from the first one")
    add_compile_progress_args(p, progress_flag=False)
    p.add_argument("--root", metavar="DIR", type=existing_dir, help="run on the board whose sysfs tree is under DIR (a twin's root): "
                   "its devices are simulated (the RK3588 NPU is the RKNN backend's), stages report modelled "
                   "time and energy at the tree's clocks; with --devices, some of them (gpu, npu:0, dla:1, big, "
                   "cluster4, ...); --root / is this host's real cores")
    p.add_argument("--trace", metavar="PATH", type=output_file,
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
    g.add_argument("--slowdown", type=non_negative_float, default=0.05, metavar="F", help="allowed slowdown (default 0.05)")
    g.add_argument("--power-budget", type=positive_float, default=None, metavar="W",
                   help="power budget in watts (board input): the tuned clocks fill it and stay under it; while "
                        "auto-tuning, a watched probe may cross it by a few percent for one unit of work")
    g.add_argument("--strict-budget", action="store_true",
                   help="with --power-budget: no probe beyond the tuner's slope bounds, never over the budget "
                        "while tuning either (a hard supply limit), at the price of part of it")
    p.add_argument("--frame-deadline-ms", type=positive_float, default=None, metavar="MS",
                   help="frame-paced work: one request per frame period (--frame-period-ms, default MS), each "
                        "due within MS (board time on a twin's devices), misses counted (deadline_misses); with "
                        "--governor phase one request's phases may take up to MS (instead of --slowdown): the "
                        "governor finds the least energy that still meets it")
    p.add_argument("--frame-period-ms", type=positive_float, default=None, metavar="MS",
                   help="frame period of --frame-deadline-ms (default: the deadline)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log the governor's decisions to stderr (as --dry-run does)")
    g.add_argument("--governor-profile", metavar="PATH", type=existing_file,
                   help="JSON profile to load if it exists, and to save what auto-tune learned to")
    g.add_argument("--dry-run", action="store_true",
                   help="decide clock changes and log each to stderr (phase, domain, from -> to, why), write nothing")
    p.set_defaults(func=main)


async def run_requests(session: object, feeds: dict[str, Any], n: int, concurrency: int, progress: Progress) -> list[float]:
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


async def stream_requests(session: object, feeds: dict[str, Any], n: int, progress: Progress) -> int:
    """``n`` requests as one stream (``Session.map``); returns how many results came back."""
    done = 0
    async with session.map(feeds for _ in range(n)) as results:  # type: ignore[attr-defined]
        async for _ in results:
            done += 1
            progress.update()
    return done


def modelled_rows(session: Any) -> list[dict[str, Any]]:
    rows = []
    devices = {st.name: st.device for st in session.plan.stages}
    from hetsched.backends.sim import SimStageStatistics

    for name, x in session.stage_statistics().items():
        if not isinstance(x, SimStageStatistics):
            continue  # a stage that runs for real models no time or energy
        if x.runs:
            rows.append({"stage": name, "device": devices[name], "runs": x.runs,
                         "time_ms_per_run": x.modelled_time_s / x.runs * 1e3,
                         "energy_mj_per_run": x.modelled_energy_j / x.runs * 1e3})
    return rows


def print_modelled(rows: list[dict[str, Any]], what: str) -> None:
    print(f"\nSIMULATED {what} (SoC twin; tensors computed for real by onnxruntime on this host):")
    print(f"{'stage':8} {'device':10} {'modelled ms/run':>16} {'modelled mJ/run':>16}")
    tot_t = tot_e = 0.0
    for row in rows:
        tot_t += row["time_ms_per_run"]
        tot_e += row["energy_mj_per_run"]
        print(f"{row['stage']:8} {row['device']:10} {row['time_ms_per_run']:16.3f} {row['energy_mj_per_run']:16.3f}")
    print(f"{'total':8} {'':10} {tot_t:16.3f} {tot_e:16.3f}  (serial sum per request)")


def governor_statistics(hooks: list[Any]) -> dict[str, Any]:
    for h in hooks:
        gov = getattr(h, "governor", None)
        if gov is not None:
            return governor_summary(gov)
    return {}


_SINGLE_ONLY: tuple[tuple[str, object, str], ...] = (("governor", "none", "--governor"), ("stream", False, "--stream"),
                ("check", False, "--check"), ("frame_deadline_ms", None, "--frame-deadline-ms"),
                ("concurrency", 1, "--concurrency"))


def _check_multi_args(args: argparse.Namespace) -> None:
    """Several models: the options that only apply to one model's run are usage errors."""
    for attr, default, flag in _SINGLE_ONLY:
        if getattr(args, attr, default) not in (default, None):
            raise SystemExit(f"hetsched run: {flag} runs one model; not with several models or --workload")
    if getattr(args, "trace", None) is not None and getattr(args, "independent", False):
        raise SystemExit("hetsched run: --trace with several models writes the one Runtime's trace (a track per "
                         "model); not with --independent")


def _check_args(args: argparse.Namespace) -> float | None:
    """Options that only go together; the frame period in ms (None: not frame-paced).

    :raises SystemExit: a usage error naming the options.
    """
    if args.governor != "none" and not args.root:
        raise SystemExit("hetsched run: --governor needs --root DIR (use --root / on a real board)")
    if args.strict_budget and (args.power_budget is None or args.governor == "none"):
        raise SystemExit("hetsched run: --strict-budget needs --governor phase and --power-budget W")
    period_ms: float | None = args.frame_period_ms if args.frame_period_ms is not None else args.frame_deadline_ms
    if period_ms is not None and args.frame_deadline_ms is None:
        raise SystemExit("hetsched run: --frame-period-ms needs --frame-deadline-ms")
    if period_ms is not None and (args.stream or args.concurrency != 1):
        raise SystemExit("hetsched run: --frame-deadline-ms paces one request per frame (no --stream, --concurrency 1)")
    return period_ms


async def _measure(s: Any, args: argparse.Namespace, feeds: dict[str, Any], board: BoardEnergy | None,
                   period_ms: float | None) -> dict[str, Any]:
    """Run the measured requests (a stream, frame-paced, or ``--concurrency`` at a time): the
    summary's request count and latency/throughput figures."""
    progress = Progress(args.requests, enabled=True if args.progress else None)
    t0 = time.perf_counter()
    if args.stream:
        done = await sampled(board, lambda: stream_requests(s, feeds, args.requests, progress))
        wall = time.perf_counter() - t0
        return {"model": str(args.model), "stages": with_accuracy(s, stage_rows(s.plan)), "requests": done,
                "mode": "stream", "throughput_rps": done / wall}
    paced = None
    if period_ms is not None:
        paced = await sampled(board, lambda: paced_requests(
            s, feeds, args.requests, period_ms / 1e3, args.frame_deadline_ms / 1e3, progress, board),
            background=False)
        lat = paced.latencies_s
    else:
        lat = await sampled(board, lambda: run_requests(s, feeds, args.requests, args.concurrency, progress))
    wall = time.perf_counter() - t0
    summary = {
        "model": str(args.model), "stages": with_accuracy(s, stage_rows(s.plan)), "requests": len(lat),
        "latency_ms_median": statistics.median(lat) * 1e3,
        "latency_ms_p99": sorted(lat)[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3,
        "throughput_rps": len(lat) / wall,
    }
    if paced is not None:
        summary.update({"frame_deadline_ms": args.frame_deadline_ms, "frame_period_ms": period_ms,
                        "deadline_misses": paced.misses, "frame_overruns": paced.overruns,
                        "latency_source": paced.source})
    return summary


async def _complete(s: Any, args: argparse.Namespace, summary: dict[str, Any], feeds: dict[str, Any], board: BoardEnergy | None,
                    hooks: list[Any]) -> None:
    """Add what the session knows after the run: inputs, refusals, compile counters, the
    ``--check``, modelled figures, re-plans, stage and board energy, the governor's summary."""
    import numpy as np

    summary["warmup_requests"] = args.warmup  # run first, left out of the latency figures
    summary["inputs"] = {name: list(np.shape(v)) for name, v in feeds.items()}
    summary["refused"] = s.plan.to_json()["refused"]
    comp = s.statistics().compile
    summary["compile"] = {"conversions": comp.conversions, "cache_hits": comp.cache_hits, "seconds": comp.seconds}
    if args.check:
        reference = await anyio.to_thread.run_sync(reference_outputs, resolve_model_arg(args.model), feeds)
        summary["check"] = compare_outputs(reference, await s.run(feeds))
    modelled = modelled_rows(s)
    if modelled:
        summary["modelled"] = modelled
    st = s.statistics()
    summary["replans"] = {"count": st.replanning.replans, "last_reason": st.replanning.last_reason,
                          "reasons": dict(st.replanning.reasons),
                          "history": [{"number": r.number, "reason": r.reason, "moved_units": r.moved_units,
                                       "seconds": r.seconds} for r in st.replanning.history],
                          "failed": st.replanning.failed, "errors": list(st.replanning.errors)}
    summary["energy_j"] = st.energy_j
    summary["energy_per_request_j"] = None
    if st.energy_j is not None and summary["requests"]:
        summary["energy_per_request_j"] = st.energy_j / summary["requests"]
        summary["energy"] = {"joules": st.energy_j, "source": st.energy_source,
                             "mj_per_request": st.energy_j / summary["requests"] * 1e3}
    summary.update(board.fields(summary["requests"]) if board is not None else {
        "board_energy_j": None, "board_energy_per_request_j": None, "board_energy_source": None,
        "board_energy_note": "no --root: the board's rails are read only under --root DIR (--root / on a board)"})
    gov_stats = governor_statistics(hooks)
    if gov_stats:
        summary["governor"] = gov_stats


def replan_lines(replans: dict[str, Any]) -> list[str]:
    """The text summary's lines for ``summary["replans"]``: a count, then every re-plan by
    number with its reason, the units it moved and its seconds, then every failed one."""
    lines: list[str] = []
    if replans["count"]:
        lines.append(f"re-planned {replans['count']} time(s) while serving:")
        lines += [f"  #{r['number']}: {r['reason']} ({r['moved_units']} unit(s) moved"
                  + (f", {r['seconds']:.3f} s)" if r["seconds"] is not None else ")")
                  for r in replans["history"]]
    lines += [f"  re-plan failed (the plan stayed): {e}" for e in replans.get("errors", ())]
    return lines


def _print_text(s: Any, args: argparse.Namespace, summary: dict[str, Any], period_ms: float | None) -> None:
    """The human-readable report of one model's run (what ``--json`` prints as one object)."""
    print(s.plan.table())
    if args.stream:
        print(f"{summary['requests']} requests streamed: {summary['throughput_rps']:.1f} req/s")
    else:
        print(f"{summary['requests']} requests: median {summary['latency_ms_median']:.2f} ms, "
              f"p99 {summary['latency_ms_p99']:.2f} ms, {summary['throughput_rps']:.1f} req/s"
              f" ({args.warmup} warm-up request(s) first, not counted)")
    if "deadline_misses" in summary:
        print(f"frame-paced every {period_ms:g} ms: {summary['deadline_misses']} of {summary['requests']} "
              f"missed the {args.frame_deadline_ms:g} ms deadline ({summary['latency_source']} latency)")
    if args.check:
        print(f"check vs onnxruntime: max |diff| {summary['check']['max_abs_diff']:.3g}, "
              f"min cosine {summary['check']['min_cosine']:.6f}")
    if "modelled" in summary:
        print_modelled(summary["modelled"], f"board under {args.root}")
    for line in replan_lines(summary["replans"]):
        print(line)
    if "energy" in summary:
        print(f"stage energy: {summary['energy']['mj_per_request']:.3f} mJ per request "
              f"({summary['energy']['source']}, every stage run, re-planned ones included)")
    if args.root:
        if summary["board_energy_per_request_j"] is not None:
            print(f"board energy: {summary['board_energy_per_request_j'] * 1e3:.3f} mJ per request "
                  f"({summary['board_energy_source']} over the run, idle between requests included)")
        else:
            print(f"board energy: n/a ({summary['board_energy_note']})")
    if "governor" in summary:
        print_governor_summary(summary["governor"])


async def _until_signalled(body_fn: Callable[[], Awaitable[int]]) -> int:
    """Run ``body_fn`` and cancel it on SIGTERM/SIGINT (its cleanup, the governor's restore
    included, runs to the end); the exit code, ``128 + signal`` when one stopped it."""
    import signal

    signalled: list[int] = []
    rc = 0
    body = anyio.CancelScope()
    async with anyio.create_task_group() as tg:

        async def watch(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            try:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    task_status.started()
                    # Only the run is cancelled, never this receiver: it keeps every later signal
                    # until the run (the governor's restore included) has unwound. A receiver that
                    # closed with the run would hand a second SIGTERM to the default handler,
                    # which kills the process half-way through the restore.
                    async for signum in signals:
                        if not signalled:
                            signalled.append(int(signum))
                            body.cancel()
            finally:
                if signalled:
                    # Closing the receiver put the default handlers back; this process is on
                    # its way out with the clocks restored, and a later signal would only turn
                    # that exit into a kill (and cut the session's own cleanup short).
                    for s in (signal.SIGTERM, signal.SIGINT):
                        signal.signal(s, signal.SIG_IGN)

        await tg.start(watch)
        try:
            with body:
                rc = await body_fn()
        finally:
            tg.cancel_scope.cancel()
    if signalled:
        print(f"hetsched run: stopped by signal {signalled[0]}; clocks restored", file=sys.stderr)
        return 128 + signalled[0]
    return rc


def main(args: argparse.Namespace) -> int:
    from hetsched import Session

    if is_multi(args):
        _check_multi_args(args)
        return run_multi(args)
    if not args.model:
        raise SystemExit("hetsched run: give a MODEL (or several), or --workload FILE")
    shapes = parse_shapes(args.shape, "hetsched run")
    require_shapes(resolve_model_arg(args.model), shapes, "hetsched run's inputs")
    calibration = calibration_arg(args, resolve_model_arg(args.model), "hetsched run")
    devices = select_devices(args.devices, args.root)
    period_ms = _check_args(args)

    async def serve(hooks: list[Any]) -> int:
        async with Session(resolve_model_arg(args.model), devices=devices, policy=args.policy,
                           max_unit_nodes=args.max_unit_nodes, root=args.root or "/",
                           hooks=[*hooks, *compile_progress_hooks(args)],
                           shapes=shapes, calibration=calibration, trace=args.trace) as s:
            feeds = random_feeds(s.get_inputs(), shapes=shapes)
            for _ in range(args.warmup):  # not in the figures: the first runs start contexts
                await s.run(feeds)
            board = BoardEnergy(args.root) if args.root else None
            summary = await _measure(s, args, feeds, board, period_ms)
            await _complete(s, args, summary, feeds, board, hooks)
            if args.json:
                print(json.dumps(summary))
            else:
                _print_text(s, args, summary, period_ms)
        return 0

    return anyio.run(_until_signalled,
                     lambda: run_governed(args, serve) if args.governor != "none" else serve([]))
