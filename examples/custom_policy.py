"""Write your own placement policy: a pure function of the placement problem.

Here: keep every unit on the device with the most temperature headroom among those
that can run it, unless another device is at least 3x faster for that unit.

    python examples/custom_policy.py
"""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import onnx

import hetsched
from hetsched.policies import DeviceState, Placement, PlacementProblem

MODEL = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"


def coolest_unless_much_faster(problem: PlacementProblem) -> Placement:
    assignment = {}
    for unit in problem.units:
        coolest = max(unit.candidates, key=lambda d: problem.devices[d].temp_headroom)
        fastest = min(unit.candidates, key=lambda d: problem.cost[(unit.id, d)])
        faster_by = problem.cost[(unit.id, coolest)] / problem.cost[(unit.id, fastest)]
        assignment[unit.id] = fastest if faster_by >= 3.0 else coolest
    return Placement(assignment, policy="coolest-unless-much-faster")


async def main() -> None:
    # Device state normally comes from telemetry; here cpu:1 is pretending to run hot.
    states = {
        "cpu:0": DeviceState("cpu:0", temp_headroom=0.6),
        "cpu:1": DeviceState("cpu:1", temp_headroom=0.1),
    }
    async with hetsched.Session(MODEL, devices=["cpu:0", "cpu:1"], policy=coolest_unless_much_faster,
                                adaptation=hetsched.Adaptation(device_states=states), max_unit_nodes=4) as s:
        print(s.plan.table())
        x = np.zeros([1, 3, 224, 224], np.float32)
        await s.run({s.get_inputs()[0].name: x})
        assert {st.device for st in s.plan.stages} == {"cpu:0"}, "the hot core should be left alone"
        print("every stage avoided the hot core")


if __name__ == "__main__":
    anyio.run(main)
