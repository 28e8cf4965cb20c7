"""Split a model across this machine's CPU cores and run it; compare with bare onnxruntime.

    python examples/quickstart.py [MODEL.onnx]
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import numpy as np
import onnx
import onnxruntime as ort

import hetsched

DEFAULT = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"


async def main(path: Path) -> None:
    async with hetsched.Session(path, devices=["cpu:0", "cpu:1", "cpu:0-1"], policy="heft",
                                max_unit_nodes=8) as session:
        print(session.plan.table())
        (inp,) = session.get_inputs()
        shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        outputs = await session.run(None, {inp.name: x})
        reference = ort.InferenceSession(str(path)).run(None, {inp.name: x})
        for got, want in zip(outputs, reference, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        print(f"{len(session.plan.stages)} stages; outputs match onnxruntime")
        # Many requests in flight: stages of different requests overlap on different devices.
        async with anyio.create_task_group() as tg:
            for _ in range(16):
                tg.start_soon(session.run, {inp.name: x})
        # A stream: the workers start the next request as they finish one, results come in order.
        frames = (np.random.default_rng(i).standard_normal(shape).astype(np.float32) for i in range(32))
        async with session.map({inp.name: f} for f in frames) as results:
            first = [out async for out in results]
            print(f"streamed {len(first)} requests; {results.statistics()}")
        print(session.statistics())


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
