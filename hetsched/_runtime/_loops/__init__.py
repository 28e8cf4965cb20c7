"""One module per event loop: the few loop-specific operations the runtime needs.

The scheduler wakes a waiting task from a device worker thread. What is cheapest differs per
event loop (a bare asyncio future resolved through ``loop.call_soon_threadsafe``; a trio
token's ``run_sync_soon`` and an anyio Event elsewhere), so each loop gets its own module with
the same functions, loaded by name as anyio loads its backends (``anyio._backends``)::

    adapter = get_loop_adapter(current_loop_name())   # "asyncio", "trio"
    waiter = adapter.new_waiter()          # event-loop thread
    adapter.call_soon_threadsafe(adapter.set_waiter, waiter)   # any thread
    await adapter.wait(waiter)             # event-loop thread

Every module defines:

* ``new_waiter() -> Waiter``: a one-shot waiter (event-loop thread);
* ``set_waiter(w) -> None``: resolve it (event-loop thread; idempotent);
* ``wait(w) -> Awaitable[None]``: what to await until ``w`` is resolved (at once if it is;
  on asyncio the future itself, so a wait allocates no coroutine);
* ``current_call_soon() -> Callable[..., object]``: the running loop's thread-safe
  "call this soon" (``fn(*args)`` runs on the loop thread; it never blocks the caller and
  raises ``RuntimeError`` once the loop is closed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from importlib import import_module
from types import ModuleType
from typing import Any, Protocol, cast

from ..._errors import UnsupportedEventLoopError

__all__ = ["LoopAdapter", "UnsupportedEventLoopError", "current_loop_adapter", "current_loop_name", "get_loop_adapter"]


class LoopAdapter(Protocol):
    """What a loop module provides (the module itself is the adapter)."""

    def new_waiter(self) -> Any: ...

    def set_waiter(self, waiter: Any) -> None: ...

    def wait(self, waiter: Any) -> Awaitable[None]: ...

    def current_call_soon(self) -> Callable[..., object]: ...


@cache
def _load(name: str) -> ModuleType:
    return import_module(f"{__name__}._{name}")


def get_loop_adapter(name: str) -> LoopAdapter:
    """The loop module for event loop ``name`` (``"asyncio"``, ``"trio"``), imported once.

    :raises UnsupportedEventLoopError: hetsched has no module for that event loop.
    """
    if not name.isidentifier():
        raise UnsupportedEventLoopError(f"unsupported event loop {name!r}: hetsched runs on asyncio and trio")
    try:
        module = _load(name)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}._{name}":
            raise  # the module exists; something it imports is missing
        raise UnsupportedEventLoopError(
            f"unsupported event loop {name!r}: hetsched runs on asyncio and trio") from None
    return cast(LoopAdapter, module)


def current_loop_name() -> str:
    """The name of the event loop running in this thread (sniffio's, when installed).

    sniffio is not a dependency of hetsched (trio depends on it): without it, the loop is asyncio.

    :raises RuntimeError: no event loop runs in this thread (``sniffio.AsyncLibraryNotFoundError``
        is one).
    """
    try:
        import sniffio
    except ImportError:
        import asyncio

        asyncio.get_running_loop()
        return "asyncio"
    return sniffio.current_async_library()


def current_loop_adapter() -> LoopAdapter:
    """The loop module for the event loop running in this thread.

    :raises UnsupportedEventLoopError: the running loop is neither asyncio nor trio.
    :raises RuntimeError: no event loop runs in this thread.
    """
    return get_loop_adapter(current_loop_name())
