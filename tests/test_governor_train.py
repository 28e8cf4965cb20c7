"""hetsched.train: phase switching from PyTorch hooks, with no change to the training loop."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hetsched import BackendUnavailableError, GovernorError
from hetsched._governor import Governor, Phase
from hetsched.testing import build_board_tree
from hetsched.train import attach


class Recorder:
    def __init__(self) -> None:
        self.phases: list[Phase] = []

    def on_phase(self, phase: Phase) -> None:
        self.phases.append(phase)


def _setup():  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 8)
    y = x.sum(dim=1, keepdim=True)
    return torch, model, opt, x, y


def _train_step(model, opt, x, y):  # type: ignore[no-untyped-def]
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def test_hooks_switch_phases_in_loop_order_and_training_still_learns() -> None:
    _torch, model, opt, x, y = _setup()
    rec = Recorder()
    with attach(model, opt, rec) as hooks:
        losses = [_train_step(model, opt, x, y) for _ in range(20)]
        st = hooks.statistics()
    assert rec.phases == [Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER_STEP, Phase.DATA] * 20
    assert st.forward_passes == st.backward_passes == st.optimizer_steps == 20 and not hooks.statistics().attached
    assert losses[-1] < losses[0] * 0.5
    # detached: the loop runs on, nothing is reported
    _train_step(model, opt, x, y)
    assert len(rec.phases) == 80


def test_eval_pass_is_inference_and_accumulation_repeats_phases() -> None:
    torch, model, opt, x, y = _setup()
    rec = Recorder()
    with attach(model, opt, rec):
        model.eval()
        with torch.no_grad():
            model(x)
        model.train()
        opt.zero_grad()
        for _ in range(2):  # gradient accumulation
            ((model(x) - y) ** 2).mean().backward()
        opt.step()
    assert rec.phases == [Phase.INFER, Phase.FORWARD, Phase.BACKWARD, Phase.FORWARD, Phase.BACKWARD,
                          Phase.OPTIMIZER_STEP, Phase.DATA]


def test_hooks_drive_a_real_governor(tmp_path: Path) -> None:
    _torch, model, opt, x, y = _setup()
    root = build_board_tree(tmp_path, "rk3588")
    with Governor(root, dry_run=True, handle_signals=False) as gov, attach(model, opt, gov):
        for _ in range(5):
            _train_step(model, opt, x, y)
        st = gov.statistics()
    assert st.phase_switches == 20
    assert {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER_STEP, Phase.DATA} <= set(st.phases)
    assert st.phases[Phase.BACKWARD].occurrences == 5


def test_bad_arguments_are_named() -> None:
    _torch, model, opt, _x, _y = _setup()
    with pytest.raises(GovernorError, match=r"torch\.nn\.Module"):
        attach(object(), opt, Recorder())
    with pytest.raises(GovernorError, match="Optimizer"):
        attach(model, object(), Recorder())
    with pytest.raises(GovernorError, match="on_phase"):
        attach(model, opt, object())  # type: ignore[arg-type]


def test_missing_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BackendUnavailableError, match=r"hetsched\[torch\]"):
        attach(object(), object(), Recorder())
