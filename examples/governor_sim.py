"""Phase-aware DVFS on the simulated Orin NX: auto-tune a training loop, save the profile, reuse it.

Runs in a few seconds of wall time (virtual board time). On a real board, replace
``Governor.simulated(board, ...)`` by ``Governor(root="/", ...)`` and run the real loop;
with PyTorch, ``hetsched.train.attach(model, optimizer, gov)`` switches the phases for you.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hetsched import Governor, GovernorProfile, Phase, PhaseWork, SimBoard

M, G = 1e6, 1e9
STEPS = [
    (Phase.DATA, PhaseWork({"cluster0": 50 * M, "cluster4": 50 * M}, 0.3 * G, overlap=0.9)),
    (Phase.FORWARD, PhaseWork({"gpu": 75 * M, "cluster0": 75 * M, "cluster4": 85 * M}, 3.0 * G, overlap=0.85)),
    (Phase.BACKWARD, PhaseWork({"gpu": 95 * M, "cluster0": 140 * M, "cluster4": 160 * M}, 11.0 * G, overlap=0.85)),
    (Phase.OPTIMIZER_STEP, PhaseWork({"gpu": 5 * M, "cluster0": 10 * M}, 1.5 * G, fixed_s=0.006, overlap=0.9)),
]


def train(board: SimBoard, gov: Governor, iterations: int) -> None:
    for _ in range(iterations):
        for phase, work in STEPS:
            with gov.phase(phase):  # the framework-free form; the loop body is unchanged
                board.execute(work, on_tick=lambda b: gov.tick())


def main() -> None:
    path = Path(tempfile.mkdtemp()) / "orin-nx-train.json"
    board = SimBoard("orin-nx")
    with Governor.simulated(board, slowdown=0.05, workload="orin-nx-train") as gov:
        train(board, gov, 400)  # auto-tunes each phase online, then runs tuned
        gov.profile().save(path)
        print("tuned:", {str(p): str(m.best) for p, m in gov.profile().phases.items()})
    e0, t0 = board.statistics().energy_j, board.time_s

    # Later (same board, same workload): reuse the profile, no tuning.
    board2 = SimBoard("orin-nx")
    with Governor.simulated(board2, profile=GovernorProfile.load(path)) as gov:
        train(board2, gov, 100)
        st = gov.statistics()
    print(f"first run: {e0:.0f} J in {t0:.0f} s (tuning included); "
          f"reloaded: {st.tuning_measurements} tuning runs, {st.writes} clock writes, "
          f"{board2.statistics().energy_j:.0f} J in {board2.time_s:.0f} s")


if __name__ == "__main__":
    main()
