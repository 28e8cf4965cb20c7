"""trio: an anyio Event, set through the trio token's ``run_sync_soon``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

__all__ = ["current_call_soon", "new_waiter", "set_waiter", "wait"]


def new_waiter() -> anyio.Event:
    return anyio.Event()


def set_waiter(waiter: anyio.Event) -> None:
    """Set ``waiter`` (event-loop thread; idempotent)."""
    waiter.set()


def wait(waiter: anyio.Event) -> Awaitable[None]:
    """What to await for ``waiter``."""
    return waiter.wait()


def current_call_soon() -> Callable[..., object]:
    import trio

    # run_sync_soon raises trio.RunFinishedError (a RuntimeError) once the run is over
    return trio.lowlevel.current_trio_token().run_sync_soon
