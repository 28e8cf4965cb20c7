"""asyncio: a bare future, resolved through ``loop.call_soon_threadsafe``.

Resolving a bare future is the cheapest cross-thread wake-up asyncio has: an anyio Event adds
layers that cost tens of microseconds per request with the caches cold after a stage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["current_call_soon", "new_waiter", "set_waiter", "wait"]


def new_waiter() -> asyncio.Future[None]:
    """A future of the running loop (event-loop thread)."""
    return asyncio.get_running_loop().create_future()


def set_waiter(waiter: asyncio.Future[None]) -> None:
    """Resolve ``waiter`` (event-loop thread; idempotent, also after its waiter was cancelled)."""
    if not waiter.done():
        waiter.set_result(None)


def wait(waiter: asyncio.Future[None]) -> Awaitable[None]:
    """What to await for ``waiter``: the future itself (no coroutine per wait)."""
    return waiter


def current_call_soon() -> Callable[..., object]:
    return asyncio.get_running_loop().call_soon_threadsafe
