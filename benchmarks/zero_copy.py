"""Zero-copy across stage boundaries: a model cut into >= 4 stages on one memory domain.

A light model (weights folded, see ``benchmarks/_light.py``) is cut into stages placed
alternately on two CPU devices of the host memory domain, and a stream of concurrent
requests runs through it, half of them with ``zero_copy=True``. Two independent counts:

* ``bytes_copied_same_domain``: bytes the buffer pools saw copied from a domain to itself
  (target 0);
* pointer identity: every ``AFTER_STAGE`` event carries the addresses each stage read and
  wrote (``StageIO``); for every request and every tensor crossing a stage boundary the
  consumer's input address must equal its producer's output address. ``stage_boundaries``
  counts the (request, producer, consumer, tensor) crossings checked,
  ``pointer_mismatches`` those where it did not hold (target 0).

Also reported: ``bytes_copied_to_caller`` (the one documented copy of a pool-backed output
handed to a caller that asked for plain arrays; here 0: the last stage's output is read by
the caller only, so the backend's allocation is handed over as it is,
``stage_runs_to_caller``, and ``zero_copy`` requests get views of the pool), pool reuse, and
that every buffer went back to its pool (``live_buffers_after``).

    .venv/bin/python benchmarks/zero_copy.py [--model squeezenet] [--stages 6] [--requests 200]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnxruntime as ort
from _labels import host, labelled, measured

from hetsched import Device, EventInfo, Hooks, Session
from hetsched.policies import Pinned

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _light import folded, random_feeds


class Trace(Hooks):
    """Records, per request, each stage's input and output addresses."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.io: dict[int, dict[str, Any]] = {}

    def after_stage(self, info: EventInfo) -> None:
        assert info.request_id is not None and info.stage is not None
        with self.lock:
            self.io.setdefault(info.request_id, {})[info.stage] = info.extra


async def main(args: argparse.Namespace) -> dict[str, Any]:
    model = folded(args.model)
    cpus = sorted(os.sched_getaffinity(0))
    devices = [Device(name=f"cpu:{c}", cpus=(c,)) for c in cpus[:2]] or [Device(name="cpu", cpus=())]
    names = [d.name for d in devices]
    trace = Trace()
    feeds = random_feeds(model)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    n_nodes = len(model.graph.node)
    async with Session(model, devices=devices, policy=Pinned(lambda u: names[u.id % len(names)]),
                       max_unit_nodes=math.ceil(n_nodes / args.stages), hooks=[trace], max_in_flight=16) as s:
        stages = s.plan.stages
        assert len(stages) >= 4, f"only {len(stages)} stages"
        domains = {s.topology.domain(d.memory_domain).name for d in devices}
        wrong = 0

        async def one(i: int) -> None:
            nonlocal wrong
            if i % 2:
                with await s.run(None, feeds, zero_copy=True) as out:
                    got = list(out.values())
                    wrong += sum(not np.allclose(g, e, rtol=1e-4, atol=1e-5) for g, e in zip(got, ref, strict=True))
            else:
                got = await s.run(None, feeds)
                wrong += sum(not np.allclose(g, e, rtol=1e-4, atol=1e-5) for g, e in zip(got, ref, strict=True))

        async with anyio.create_task_group() as tg:
            for i in range(args.requests):
                tg.start_soon(one, i)
        st = s.statistics()
        # every boundary value: (producer stage, consumer stage, value)
        producer = {o: sp.name for sp in stages for o in sp.outputs}
        edges = [(producer[v], sp.name, v) for sp in stages for v in sp.inputs if v in producer]
    checked = mismatches = 0
    for per_stage in trace.io.values():
        for prod, cons, value in edges:
            if prod in per_stage and cons in per_stage:
                checked += 1
                if per_stage[prod].outputs[value] != per_stage[cons].inputs[value]:
                    mismatches += 1
    pools = st.pools.values()
    return {
        "model": args.model,
        "stages": len(stages),
        "devices": names,
        "memory_domains": sorted(domains),
        "requests": args.requests,
        "wrong_outputs": wrong,
        "boundary_tensors_per_request": len(edges),
        "stage_runs_bound": st.stage_runs_bound,
        "stage_runs_unbound": st.stage_runs_unbound,
        "stage_runs_to_caller": st.stage_runs_to_caller,
        "bytes_copied_to_caller": st.bytes_copied_to_caller,
        "pool_reuse_rate": round(sum(p.reuses for p in pools) / max(1, sum(p.acquisitions for p in pools)), 4),
        "live_buffers_after": sum(p.live_buffers for p in pools),
        "pointer_mismatches": mismatches,
        "bytes_copied_same_domain": st.bytes_copied_same_domain,
        "stage_boundaries": checked,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--stages", type=int, default=6, help="units to cut the model into (>= 4 stages result)")
    ap.add_argument("--requests", type=int, default=200)
    print(json.dumps(labelled(anyio.run(main, ap.parse_args()), board=host(), figures=measured("counted copies and pointers"))))
