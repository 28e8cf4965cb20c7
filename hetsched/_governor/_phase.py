"""The phases a governed program goes through."""

from __future__ import annotations

from .._compat import StrEnum
from .._errors import GovernorError

__all__ = ["Phase", "as_phase"]


class Phase(StrEnum):
    """What the governed program is doing right now; the governor sets clocks per phase.

    Where each phase is entered, as pseudocode of the two loops it governs
    (``# <PHASE>`` marks the point where the governor switches to it)::

        # training (hetsched.train.attach switches these from PyTorch hooks;
        # anything else uses ``with governor.phase(Phase.X):``)
        for epoch in range(epochs):
            for batch in loader:          # DATA            load, decode, augment (CPU, memory)
                loss = model(batch)       # FORWARD         compute-bound: wants core clocks
                loss.backward()           # BACKWARD        memory-bound: memory clock, less core
                optimizer.step()          # OPTIMIZER_STEP  mostly waiting: lowest clocks
                optimizer.zero_grad()     # DATA            (until the next forward)

        # inference (a Session run with a governor emits these itself)
        while requests:
            request = await next_request()   # IDLE         nothing to do: everything low
            x = preprocess(request)          # PREPROCESS   CPU
            y = await run(model, x)          # INFER        the accelerator(s) and memory
            reply(postprocess(y))            # POSTPROCESS  CPU

    Values are the lowercase names (``Phase.BACKWARD == "backward"``), so strings work
    wherever a phase is taken.
    """

    DATA = "data"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER_STEP = "optimizer_step"
    PREPROCESS = "preprocess"
    INFER = "infer"
    POSTPROCESS = "postprocess"
    IDLE = "idle"

    @property
    def is_training(self) -> bool:
        """True for DATA, FORWARD, BACKWARD and OPTIMIZER_STEP."""
        return self in _TRAINING

    @property
    def is_inference(self) -> bool:
        """True for PREPROCESS, INFER and POSTPROCESS."""
        return self in _INFERENCE


_TRAINING = frozenset({Phase.DATA, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER_STEP})
_INFERENCE = frozenset({Phase.PREPROCESS, Phase.INFER, Phase.POSTPROCESS})


def as_phase(phase: Phase | str) -> Phase:
    """``phase`` as a :class:`Phase`. :raises GovernorError: not a phase name (the message lists them)."""
    if isinstance(phase, Phase):
        return phase
    try:
        return Phase(phase)
    except ValueError as exc:
        raise GovernorError(f"unknown phase {phase!r}; phases: {', '.join(p.value for p in Phase)}") from exc
