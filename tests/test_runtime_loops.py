"""The event-loop modules (hetsched._runtime._loops): one per loop, the same few functions.

The asyncio module's tests run on pytest-asyncio (they are about asyncio itself); the trio
module's on anyio's plugin with the trio backend.
"""

from __future__ import annotations

import asyncio
import threading

import anyio
import pytest

from hetsched._runtime._loops import (
    UnsupportedEventLoopError,
    current_loop_adapter,
    current_loop_name,
    get_loop_adapter,
)


def _set_from_another_thread(call_soon: object, set_waiter: object, waiter: object) -> threading.Thread:
    def work() -> None:
        call_soon(set_waiter, waiter)  # type: ignore[operator]

    t = threading.Thread(target=work)
    t.start()
    return t


# -- asyncio ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_asyncio_module_is_chosen_by_name_and_cached() -> None:
    assert current_loop_name() == "asyncio"
    adapter = current_loop_adapter()
    assert adapter is get_loop_adapter("asyncio")
    assert adapter.__name__ == "hetsched._runtime._loops._asyncio"  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_asyncio_waiter_is_a_bare_future_of_the_running_loop() -> None:
    # the hot path's promise: no wrapper object around the future, and waiting on it awaits
    # the future itself (no coroutine per wait)
    loop = get_loop_adapter("asyncio")
    w = loop.new_waiter()
    assert type(w) is asyncio.Future or isinstance(w, asyncio.Future)
    assert w.get_loop() is asyncio.get_running_loop()
    assert loop.wait(w) is w
    assert loop.current_call_soon() == asyncio.get_running_loop().call_soon_threadsafe


@pytest.mark.asyncio
async def test_asyncio_waiter_set_from_another_thread_wakes_the_loop() -> None:
    loop = get_loop_adapter("asyncio")
    w = loop.new_waiter()
    t = _set_from_another_thread(loop.current_call_soon(), loop.set_waiter, w)
    with anyio.fail_after(10):  # fails (instead of hanging) if the wake-up never arrives
        await loop.wait(w)
    assert w.done()
    t.join()


@pytest.mark.asyncio
async def test_asyncio_waiter_set_before_waiting_returns_at_once_and_set_is_idempotent() -> None:
    loop = get_loop_adapter("asyncio")
    w = loop.new_waiter()
    loop.set_waiter(w)
    loop.set_waiter(w)  # a second wake-up of the same waiter is harmless
    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "other")
    await loop.wait(w)
    # a resolved future is awaited without yielding to the loop: nothing else ran meanwhile
    assert ran == []


@pytest.mark.asyncio
async def test_asyncio_set_after_its_waiter_was_cancelled_is_harmless() -> None:
    loop = get_loop_adapter("asyncio")
    w = loop.new_waiter()
    w.cancel()
    loop.set_waiter(w)  # a worker finishing a request whose caller gave up
    assert w.cancelled()


# -- trio -------------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.mark.anyio
async def test_trio_module_is_chosen_by_name_and_cached() -> None:
    assert current_loop_name() == "trio"
    adapter = current_loop_adapter()
    assert adapter is get_loop_adapter("trio")
    assert adapter.__name__ == "hetsched._runtime._loops._trio"  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_trio_waiter_set_from_another_thread_wakes_the_loop() -> None:
    loop = get_loop_adapter("trio")
    w = loop.new_waiter()
    t = _set_from_another_thread(loop.current_call_soon(), loop.set_waiter, w)
    with anyio.fail_after(10):
        await loop.wait(w)
    assert w.is_set()
    t.join()


@pytest.mark.anyio
async def test_trio_waiter_set_before_waiting_returns_at_once() -> None:
    loop = get_loop_adapter("trio")
    w = loop.new_waiter()
    loop.set_waiter(w)
    loop.set_waiter(w)
    with anyio.fail_after(10):
        await loop.wait(w)
    assert w.is_set()


# -- names ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["curio", "twisted", "../x", ""])
def test_an_unknown_event_loop_is_named_in_a_clear_error(name: str) -> None:
    with pytest.raises(UnsupportedEventLoopError, match=r"unsupported event loop .*asyncio and trio"):
        get_loop_adapter(name)


def test_no_running_loop_raises() -> None:
    with pytest.raises(RuntimeError):
        current_loop_adapter()
