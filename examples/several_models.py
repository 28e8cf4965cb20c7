"""Several models on one board: one ``hetsched.Runtime``, a detector with an SLO beside closed loops.

On the Orin NX twin's devices (the SoC twin simulates the board's timing, power and heat; every
tensor is still computed by onnxruntime on this host), a detector offered at 30 requests/s with
``Priority.HIGH`` and a 33 ms SLO, and three background classifiers (ResNet-50) each run as a
closed loop. The runtime places them jointly: the detector first, then each loop where something
is left and a request costs no more energy (the DLAs beside the GPU), and serves every device's
queue by priority, then deadline. One set of device workers serves them all.

    python examples/several_models.py
"""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import onnx

import hetsched
from hetsched.backends.sim import twin_devices

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light"


async def main() -> None:
    x = np.random.default_rng(0).standard_normal([1, 3, 224, 224]).astype(np.float32)
    async with hetsched.Runtime(devices=twin_devices("orin-nx")) as rt:
        detector = hetsched.Session(LIGHT / "light_squeezenet.onnx", runtime=rt, name="detector",
                                    priority=hetsched.Priority.HIGH, slo_s=0.033, rate_hz=30.0)
        loops = [hetsched.Session(LIGHT / "light_resnet50.onnx", runtime=rt, name=f"background{i}",
                                  priority=hetsched.Priority.BACKGROUND) for i in range(3)]
        async with detector as det, loops[0] as b0, loops[1] as b1, loops[2] as b2:
            for s in (det, b0, b1, b2):  # opened one after another: each one placed knowing the others
                print(f"{s.name:12} on {' -> '.join(st.device for st in s.plan.stages)}")

            async def loop(s: hetsched.Session, n: int) -> None:
                for _ in range(n):
                    await s.run({"gpu_0/data_0": x})

            async with anyio.create_task_group() as tg:
                for s in (b0, b1, b2):
                    tg.start_soon(loop, s, 2)
                for _ in range(4):
                    await det.run({"data_0": x})
            placed = sorted({st.device for s in (b0, b1, b2) for st in s.plan.stages if st.device != "gpu"
                             and not st.device.startswith("cluster")})
        st = rt.statistics()
    print(f"worker threads: {st.worker_threads} for {len(st.sessions)} sessions")
    for share in sorted(st.sessions, key=lambda s: s.name):
        print(f"  {share.name:12} {share.requests} requests, modelled busy share {share.busy_share:.3f}")
    print(f"background loops spread over the GPU and {', '.join(placed) or 'nothing else'}")


if __name__ == "__main__":
    anyio.run(main)
