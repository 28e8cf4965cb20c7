"""Phase-aware DVFS for PyTorch training loops, with no change to the loop.

::

    import hetsched
    from hetsched.train import attach

    with hetsched.Governor(root="/") as gov, attach(model, optimizer, gov):
        for x, y in loader:                 # DATA
            loss = loss_fn(model(x), y)     # FORWARD   (forward pre-hook)
            optimizer.zero_grad()
            loss.backward()                 # BACKWARD  (hook on the model's output gradient)
            optimizer.step()                # OPTIMIZER_STEP (step pre-hook), then DATA (post-hook)

Anything with an ``on_phase(phase)`` method can stand in for the governor. PyTorch is an
optional extra (``pip install 'hetsched[torch]'``) and is imported only by :func:`attach`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from ._errors import BackendUnavailableError, GovernorError
from ._governor._phase import Phase

__all__ = ["PhaseListener", "TrainingHooks", "TrainingHooksStatistics", "attach"]


class PhaseListener(Protocol):
    """What the hooks drive: a :class:`hetsched.Governor`, or anything with ``on_phase``."""

    def on_phase(self, phase: Phase) -> None: ...


@dataclass(frozen=True)
class TrainingHooksStatistics:
    forward_passes: int
    backward_passes: int
    optimizer_steps: int
    phase_switches: int
    attached: bool


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise BackendUnavailableError(
            "hetsched.train needs PyTorch, which is not installed: pip install 'hetsched[torch]'"
        ) from exc
    return torch


class TrainingHooks:
    """The hooks :func:`attach` registered; :meth:`detach` (or leaving ``with``) removes them."""

    def __init__(self, torch: Any, model: Any, optimizer: Any, listener: PhaseListener) -> None:
        self._torch = torch
        self._listener = listener
        self._lock = threading.Lock()  # CUDA autograd runs backward hooks on its own threads
        self._phase: Phase | None = None
        self._fwd = self._bwd = self._steps = self._switches = 0
        self._handles = [
            model.register_forward_pre_hook(self._forward_pre),
            model.register_forward_hook(self._forward_post),
            optimizer.register_step_pre_hook(self._step_pre),
            optimizer.register_step_post_hook(self._step_post),
        ]

    def _switch(self, phase: Phase) -> None:
        with self._lock:
            if phase is self._phase:
                return
            self._phase = phase
            self._switches += 1
        self._listener.on_phase(phase)

    def _forward_pre(self, module: Any, args: Any) -> None:
        self._fwd += 1
        # Evaluation passes (model.eval() or no_grad) are inference, not training.
        training = module.training and self._torch.is_grad_enabled()
        self._switch(Phase.FORWARD if training else Phase.INFER)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        tensor = self._first_grad_tensor(output)
        if tensor is not None:
            # Fires when the gradient reaches the model's output: the backward pass begins.
            tensor.register_hook(self._backward_start)

    def _first_grad_tensor(self, obj: Any) -> Any:
        if self._torch.is_tensor(obj):
            return obj if obj.requires_grad else None
        if isinstance(obj, dict):
            obj = list(obj.values())
        if isinstance(obj, list | tuple):
            for item in obj:
                found = self._first_grad_tensor(item)
                if found is not None:
                    return found
        return None

    def _backward_start(self, grad: Any) -> None:
        self._bwd += 1
        self._switch(Phase.BACKWARD)

    def _step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._steps += 1
        self._switch(Phase.OPTIMIZER_STEP)

    def _step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # After the step the loop fetches the next batch.
        self._switch(Phase.DATA)

    def detach(self) -> None:
        """Remove every hook (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def statistics(self) -> TrainingHooksStatistics:
        return TrainingHooksStatistics(self._fwd, self._bwd, self._steps, self._switches, bool(self._handles))

    def __enter__(self) -> TrainingHooks:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.detach()


def attach(model: Any, optimizer: Any, governor: PhaseListener) -> TrainingHooks:
    """Switch ``governor``'s phase from hooks on ``model`` and ``optimizer``.

    Forward pre-hook: FORWARD (INFER for eval/no-grad passes); the model output's gradient
    hook: BACKWARD; optimizer step pre-hook: OPTIMIZER_STEP; step post-hook: DATA. The
    training loop is not changed. Returns the hooks (a context manager that detaches them).

    :raises BackendUnavailableError: PyTorch is not installed (names the ``torch`` extra).
    :raises GovernorError: ``model`` is not a ``torch.nn.Module``, ``optimizer`` not a
        ``torch.optim.Optimizer``, or ``governor`` has no ``on_phase``.
    """
    torch = _import_torch()
    if not isinstance(model, torch.nn.Module):
        raise GovernorError(f"attach: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise GovernorError(f"attach: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not callable(getattr(governor, "on_phase", None)):
        raise GovernorError(f"attach: governor must have on_phase(phase), got {type(governor).__name__}")
    return TrainingHooks(torch, model, optimizer, governor)
