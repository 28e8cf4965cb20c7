"""Restore against races: a phase hook racing the shutdown, a twin re-rendering a knob as it is restored."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from test_governor_sysfs import Live, knobs

from hetsched import RuntimeStateError
from hetsched._governor import Governor, GovernorEngine, Phase

from _governor_fakes import TableBoard, additive_table


def _table():  # type: ignore[no-untyped-def]
    return additive_table({Phase.FORWARD: {"gpu": 0.2e9}}, {"cluster0": 1.0, "gpu": 6.0, "memory": 1.2})


def test_a_hook_that_raced_the_shutdown_writes_nothing_after_the_restore() -> None:
    board = TableBoard(_table())
    gov = Governor(port=board, autotune=False, handle_signals=False)
    gov.__enter__()
    gov.on_phase(Phase.FORWARD)
    board.run(gov.engine, Phase.FORWARD)
    done = threading.Event()

    def hook() -> None:
        gov.on_phase(Phase.IDLE)  # passes the entry check, then waits for the lock
        done.set()

    with gov._lock:  # the shutdown holds the lock while it restores
        t = threading.Thread(target=hook)
        t.start()
        time.sleep(0.1)
        gov.__exit__(None, None, None)
        restored_writes = len(board.writes)
    t.join(timeout=5)
    assert done.is_set()
    assert len(board.writes) == restored_writes  # the late hook wrote nothing
    assert gov.statistics().restored
    # The engine itself refuses a phase once it has restored the clocks.
    with pytest.raises(RuntimeStateError, match="restored"):
        gov.engine.enter(Phase.FORWARD)
    eng = GovernorEngine(TableBoard(_table()))
    eng.start()
    eng.close()
    with pytest.raises(RuntimeStateError):
        eng.enter(Phase.IDLE)


@pytest.mark.parametrize("soc", ["rk3588", "orin-nx"])
def test_restore_rewrites_a_knob_the_twin_reverted_meanwhile(soc: str, tmp_path: Path) -> None:
    live = Live(soc, tmp_path)
    before = knobs(live.root)
    gov = live.governor()
    stale: dict[str, bytes] = {}
    with gov:
        live.drive(gov)
        stale = knobs(live.root)
        port = gov.engine.port
        restore_domain = port._restore_domain  # type: ignore[attr-defined]
        reverted: list[str] = []

        def racing_restore(d, kn):  # type: ignore[no-untyped-def]
            restore_domain(d, kn)
            # Once, right after a domain's knobs are written back: the twin re-renders one
            # from the state it had before the writes (the race a live tree has with a writer).
            if not reverted:
                for k in kn:
                    if stale.get(k) not in (None, before.get(k)):
                        (live.root / k).write_bytes(stale[k])
                        reverted.append(k)
                        break

        port._restore_domain = racing_restore  # type: ignore[attr-defined]
    live.twin.advance(0.0)
    assert reverted, "nothing to revert: the governor never moved a knob"
    assert knobs(live.root) == before


@pytest.mark.parametrize("soc", ["rk3588", "orin-nx"])
def test_a_reverted_knob_is_rewritten_even_when_every_wait_overshoots(soc: str, tmp_path: Path) -> None:
    """The flake of ``test_sigterm_restores_every_knob`` under load: the twin re-rendered a knob
    from its old state just as the restore wrote it, and the restore's wait, bounded in time,
    ran out (each sleep overshooting on a loaded host) before the eighth wait that used to
    write it again. It is written again at the first wait that sees it off."""
    live = Live(soc, tmp_path)
    before = knobs(live.root)
    gov = live.governor()

    def loaded_sleep(s: float) -> None:  # a loaded host: each wait takes 0.3 s, not s
        live.clock.t += 0.3
        live.twin.advance(0.0)

    reverted: list[str] = []
    with gov:
        live.drive(gov)
        stale = knobs(live.root)
        port = gov.engine.port
        port._sleep = loaded_sleep  # type: ignore[attr-defined]
        restore_domain = port._restore_domain  # type: ignore[attr-defined]

        def racing_restore(d, kn):  # type: ignore[no-untyped-def]
            restore_domain(d, kn)
            if not reverted:
                for k in kn:
                    if stale.get(k) not in (None, before.get(k)):
                        (live.root / k).write_bytes(stale[k])  # the twin's stale re-render
                        live.twin.tree._written[live.root / k] = stale[k]  # (as the twin's own write)
                        reverted.append(k)
                        break

        port._restore_domain = racing_restore  # type: ignore[attr-defined]
    assert reverted, "nothing to revert: the governor never moved a knob"
    live.twin.advance(0.0)
    assert knobs(live.root) == before
