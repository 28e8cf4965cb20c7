"""``hetsched plan MODEL``: show how a model is split and placed."""

from __future__ import annotations

import argparse
import json

import anyio

from ._common import add_devices_args, resolve_model_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="partition and place a model; print the placement table")
    p.add_argument("model", help="path to an .onnx file, or an embedded model name (e.g. light_resnet50)")
    add_devices_args(p)
    p.add_argument("--profile", action="store_true", help="measure units on each device, then re-plan")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from hetsched import Session

    from ._common import default_host_devices

    async def go() -> int:
        async with Session(resolve_model_arg(args.model), devices=args.devices or default_host_devices(),
                           policy=args.policy, max_unit_nodes=args.max_unit_nodes) as s:
            if args.profile:
                await s.profile()
            if args.json:
                print(json.dumps(s.plan.to_json(), indent=1))
            else:
                print(f"policy: {s.plan.placement.policy}; devices: {', '.join(d.name for d in s.devices)}")
                print(s.plan.table())
        return 0

    return anyio.run(go)
