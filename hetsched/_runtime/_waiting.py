"""Tasks waiting for room in a buffer pool, and waking them from any thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from ._loops import LoopAdapter, current_loop_adapter

__all__: list[str] = []


class _Waiter:
    """A task waiting for ``nbytes`` of a pool's budget (made on that task's event loop)."""

    __slots__ = ("call", "closed", "event", "granted", "loop", "nbytes", "thread")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.loop: LoopAdapter = current_loop_adapter()
        self.event: Any = self.loop.new_waiter()
        self.granted = False
        self.closed = False
        self.thread = threading.get_ident()
        self.call: Callable[..., object] = self.loop.current_call_soon()

    async def wait(self) -> None:
        await self.loop.wait(self.event)


def _wake(waiters: Iterable[_Waiter]) -> None:
    me = threading.get_ident()
    for w in waiters:
        if w.thread == me:
            w.loop.set_waiter(w.event)
        else:
            try:
                w.call(w.loop.set_waiter, w.event)
            except RuntimeError:
                pass  # that event loop has ended; nobody is waiting any more
