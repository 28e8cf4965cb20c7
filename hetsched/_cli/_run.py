"""``hetsched run MODEL``: run requests through a model and report latency and throughput."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import anyio

from ._common import Progress, add_devices_args, default_host_devices, random_feeds, resolve_model_arg


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="run requests through a model (random inputs)")
    p.add_argument("model", help="path to an .onnx file, or an embedded model name")
    add_devices_args(p)
    p.add_argument("--requests", type=int, default=20, metavar="N", help="number of requests (default 20)")
    p.add_argument("--concurrency", type=int, default=1, metavar="K", help="requests in flight at once")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--progress", action="store_true", help="force the progress bar")
    p.set_defaults(func=main)


async def run_requests(session: object, feeds: dict, n: int, concurrency: int, progress: Progress) -> list[float]:
    latencies: list[float] = []
    limiter = anyio.Semaphore(max(1, concurrency))

    async def one() -> None:
        async with limiter:
            t0 = time.perf_counter()
            await session.run(feeds)  # type: ignore[attr-defined]
            latencies.append(time.perf_counter() - t0)
            progress.update()

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return latencies


def main(args: argparse.Namespace) -> int:
    from hetsched import Session

    if args.requests < 1:
        raise SystemExit("hetsched run: --requests must be >= 1")

    async def go() -> int:
        async with Session(resolve_model_arg(args.model), devices=args.devices or default_host_devices(),
                           policy=args.policy, max_unit_nodes=args.max_unit_nodes) as s:
            feeds = random_feeds(s.get_inputs())
            progress = Progress(args.requests, enabled=True if args.progress else None)
            t0 = time.perf_counter()
            lat = await run_requests(s, feeds, args.requests, args.concurrency, progress)
            wall = time.perf_counter() - t0
            summary = {
                "model": str(args.model), "stages": len(s.plan.stages), "requests": len(lat),
                "latency_ms_median": statistics.median(lat) * 1e3,
                "latency_ms_p99": sorted(lat)[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3,
                "throughput_rps": len(lat) / wall,
            }
            if args.json:
                print(json.dumps(summary))
            else:
                print(s.plan.table())
                print(f"{summary['requests']} requests: median {summary['latency_ms_median']:.2f} ms, "
                      f"p99 {summary['latency_ms_p99']:.2f} ms, {summary['throughput_rps']:.1f} req/s")
        return 0

    return anyio.run(go)
