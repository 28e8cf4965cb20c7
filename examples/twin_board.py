"""Run a model on a simulated RK3588 (the SoC twin) and watch its telemetry.

The twin keeps a live sysfs tree under a temporary root; hetsched discovers the board
from that tree exactly as it would from ``/`` on a real board. Tensors are computed for
real by onnxruntime on this host; the twin models the board's time, power and heat.

    python examples/twin_board.py [rk3588|orin-nx]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio
import numpy as np
import onnx

import hetsched
from hetsched.backends.sim import clock_from_root, twin_devices
from hetsched.lowlevel import power_estimator_for

MODEL = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"


async def main(soc: str) -> None:
    with tempfile.TemporaryDirectory() as root:
        async with hetsched.LiveTwin(soc, root, speed=10.0) as twin:
            platform = hetsched.discover(root)
            print(f"board under {root}: soc={platform.soc}, clusters="
                  f"{[c.cpus for c in platform.cpu_clusters]}, devices={[d.name for d in platform.devices]}")
            devices = twin_devices(platform.soc or soc, clock=clock_from_root(root))
            estimator = power_estimator_for(platform)  # the SoC's power model: the RK3588 has no sensor
            async with hetsched.Telemetry(root, period_s=0.05, estimator=estimator) as telemetry:
                async with hetsched.Session(MODEL, devices=devices, root=root, max_unit_nodes=8) as s:
                    print(s.plan.table())
                    x = np.zeros([1, 3, 224, 224], np.float32)
                    for _ in range(10):
                        twin.report_utilisation("gpu", 1.0)
                        await s.run({s.get_inputs()[0].name: x})
                    await anyio.sleep(0.2)
                snap = telemetry.latest()
                temps = {z.name: z.temp_c for z in snap.zones.values()}
                print(f"zones: {temps}")
                print(f"rails: {{{', '.join(f'{r.name}: {r.power_w}' for r in snap.rails.values())}}}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "rk3588")
