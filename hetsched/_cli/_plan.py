"""``hetsched plan MODEL``: show how a model is split and placed.

``--json`` prints :meth:`Plan.to_json`: ``stages`` (each with ``name``, ``device``, ``backend``,
``nodes`` (a count), ``flops`` (analytic), ...), ``units``, ``devices`` and ``refused`` (the units
a backend refused to compile on a device its op list offered, with the backend's reason); with
``--root`` and no ``--devices`` also ``device_notes``: what the board's default devices left out
and why (the RK3588 NPU without its toolkit), which the table output prints as ``note:`` lines.
"""

from __future__ import annotations

import argparse
import json

import anyio

from ._common import (
    Progress,
    add_compile_progress_args,
    add_devices_args,
    add_shape_arg,
    compile_progress_hooks,
    existing_dir,
    parse_shapes,
    require_shapes,
    resolve_model_arg,
    select_devices,
)
from ._compile import add_int8_args, calibration_arg, with_accuracy


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="partition and place a model; print the placement table")
    p.add_argument("model", help="path to an .onnx file, or an embedded model name (e.g. light_resnet50)")
    add_devices_args(p)
    p.add_argument("--root", metavar="DIR", type=existing_dir, help="plan for the board whose sysfs tree is under DIR (a twin's root): "
                   "its devices (notes say what the default list leaves out); with --devices, some of them "
                   "(gpu, npu:0, dla:1, big, cluster4, ...)")
    add_shape_arg(p)
    add_int8_args(p)
    p.add_argument("--profile", action="store_true", help="measure units on each device, then re-plan")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_compile_progress_args(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from hetsched import Session

    shapes = parse_shapes(args.shape, "hetsched plan")
    require_shapes(resolve_model_arg(args.model), shapes, "hetsched plan's inputs")
    calibration = calibration_arg(args, resolve_model_arg(args.model), "hetsched plan")
    devices = select_devices(args.devices, args.root)
    notes: list[str] = []
    if args.root and not args.devices:
        from hetsched._devices.resolve import board_device_notes

        notes = board_device_notes(args.root)

    async def go() -> int:
        async with Session(resolve_model_arg(args.model), devices=devices, policy=args.policy,
                           max_unit_nodes=args.max_unit_nodes, root=args.root or "/", shapes=shapes, calibration=calibration,
                           hooks=compile_progress_hooks(args)) as s:
            if args.profile:
                bar = Progress(0, enabled=False if args.json or args.quiet else None, label="unit runs (profiling)")
                await s.profile(progress=bar.advance_to)
            if args.json:
                data = s.plan.to_json()
                data["stages"] = with_accuracy(s, data["stages"])
                if args.root and not args.devices:
                    data["device_notes"] = notes
                print(json.dumps(data, indent=1))
            else:
                print(f"policy: {s.plan.placement.policy}; devices: {', '.join(d.name for d in s.devices)}")
                for note in notes:
                    print(f"note: {note}")
                print(s.plan.table())
        return 0

    return anyio.run(go)
