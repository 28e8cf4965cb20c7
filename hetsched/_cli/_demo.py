"""``hetsched demo``: the main job on the embedded default model.

Places ``light_squeezenet`` (shipped inside the onnx wheel) on the host's devices (split into stages where that pays),
prints the placement table, runs requests, checks every output against bare
onnxruntime and prints latency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import anyio

from ._common import (
    DEFAULT_MODEL,
    add_devices_args,
    existing_dir,
    light_model,
    positive_int,
    random_feeds,
    select_devices,
    soc_devices,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="split an embedded model across this machine's devices and run it")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"embedded model (default {DEFAULT_MODEL})")
    add_devices_args(p)
    p.set_defaults(max_unit_nodes=8)
    p.add_argument("--soc", metavar="SOC", help="place and run on a simulated board (SoC twin): rk3588, orin-nx, "
                   "orin-agx, orin-nano; prints each stage's modelled time and energy; with --devices, some of "
                   "its devices (cluster4, gpu, npu, dla:0, big, ...)")
    p.add_argument("--root", metavar="DIR", type=existing_dir, help="place and run on the board whose sysfs tree is under DIR (a twin's "
                   "root, see 'hetsched twin'); with --devices, some of its devices")
    p.add_argument("--requests", type=positive_int, default=20, metavar="N")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of tables")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import numpy as np

    from hetsched import HetschedError, Session
    from hetsched._onnxruntime import ort_session

    path = light_model(args.model)
    if args.soc and args.root:
        raise SystemExit("hetsched demo: --soc and --root both name the board; give one (--root for a twin's tree)")
    devices = soc_devices(args.soc, args.devices) if args.soc else select_devices(args.devices, args.root)

    async def go() -> int:
        async with Session(path, devices=devices, policy=args.policy, max_unit_nodes=args.max_unit_nodes,
                           root=args.root or "/") as s:
            feeds = random_feeds(s.get_inputs())
            ref = ort_session(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
            out = await s.run(None, feeds)
            max_diff = max(float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(out, ref, strict=True))
            if not all(np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(out, ref, strict=True)):
                raise HetschedError(f"demo outputs differ from onnxruntime's (max abs diff {max_diff})")
            lat = []
            for _ in range(args.requests):
                t0 = time.perf_counter()
                await s.run(feeds)
                lat.append(time.perf_counter() - t0)
            n_conc = max(args.requests, 8)
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(n_conc):
                    tg.start_soon(s.run, feeds)
            wall = time.perf_counter() - t0
            t0 = time.perf_counter()
            async with s.map(feeds for _ in range(n_conc)) as results:
                streamed = sum([1 async for _ in results])
            stream_wall = time.perf_counter() - t0
            stages_per_device: dict[str, int] = {}
            for st in s.plan.stages:
                stages_per_device[st.device] = stages_per_device.get(st.device, 0) + 1
            summary = {
                "model": path.stem,
                "policy": s.plan.placement.policy,
                "devices": [d.name for d in s.devices],
                "stages": len(s.plan.stages),
                "stages_per_device": stages_per_device,
                "max_abs_diff_vs_onnxruntime": max_diff,
                "latency_ms_median": statistics.median(lat) * 1e3,
                "pipelined_throughput_rps": n_conc / wall,
                "stream_throughput_rps": streamed / stream_wall,
            }
            from ._run import modelled_rows, print_modelled

            sim = modelled_rows(s)
            if sim:
                summary["soc"] = args.soc or _root_soc(args.root)
                summary["modelled"] = sim
            if args.json:
                print(json.dumps(summary))
                return 0
            print(f"hetsched demo: {path.stem} (from the onnx wheel), policy {summary['policy']}, "
                  f"max {args.max_unit_nodes} nodes per unit")
            print(f"devices: {', '.join(summary['devices'])}\n")
            print(s.plan.table())
            n_st, n_dev = len(s.plan.stages), len(stages_per_device)
            print(f"\n{n_st} stage{'s' * (n_st != 1)} on {n_dev} device{'s' * (n_dev != 1)}; outputs match onnxruntime "
                  f"(max abs diff {max_diff:.2e})")
            print(f"single request latency: median {summary['latency_ms_median']:.2f} ms over {args.requests}")
            print(f"{n_conc} concurrent requests, pipelined: {summary['pipelined_throughput_rps']:.1f} req/s")
            print(f"{streamed} requests as one stream (Session.map): {summary['stream_throughput_rps']:.1f} req/s")
            if sim:
                print_modelled(sim, str(args.soc or f"board under {args.root}"))
        return 0

    return anyio.run(go)


def _root_soc(root: str | None) -> str | None:
    from hetsched._devices.board import board_soc
    from hetsched._platform import SysfsRoot

    return board_soc(SysfsRoot(root)) if root else None
