"""``SyncSession``: a blocking facade over :class:`~hetsched.Session` for code without an event loop.

It owns an event loop in a helper thread (an anyio blocking portal) for the length of its
``with`` block and forwards each call to the :class:`Session` living there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

import anyio.from_thread
import numpy as np

from .._errors import RuntimeStateError
from .._events import Priority
from .._planning.costs import CostTable
from .._planning.model import ModelSource
from .._planning.plan import Plan
from ._delivery import Outputs
from ._session import Session, SessionStatistics

__all__ = ["SyncSession"]


class SyncSession:
    """A blocking facade over :class:`Session` for non-async applications.

    ::

        with hetsched.SyncSession("model.onnx", devices=["cpu:0", "cpu:1"]) as s:
            outputs = s.run({"x": x})

    An event loop runs in a helper thread owned by the ``with`` block.

    :param backend: the event loop of that thread (``"asyncio"`` or ``"trio"``).
    :param kwargs: :class:`Session`'s keywords.
    """

    def __init__(self, model: ModelSource, *, backend: str = "asyncio", **kwargs: Any):
        self._session = Session(model, **kwargs)
        self._backend = backend
        self._portal_cm: Any = None
        self._portal: Any = None
        self._ctx: Any = None

    def __enter__(self) -> SyncSession:
        self._portal_cm = anyio.from_thread.start_blocking_portal(self._backend)
        self._portal = self._portal_cm.__enter__()
        try:
            self._ctx = self._portal.wrap_async_context_manager(self._session)
            self._ctx.__enter__()
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._ctx.__exit__(*exc)
        finally:
            self._portal = None  # later calls raise RuntimeStateError, not the portal's RuntimeError
            self._portal_cm.__exit__(None, None, None)

    @property
    def plan(self) -> Plan:
        return self._session.plan

    @property
    def session(self) -> Session:
        return self._session

    def _require_portal(self) -> Any:
        if self._portal is None:
            raise RuntimeStateError("SyncSession is not open: use 'with SyncSession(...)'")
        return self._portal

    @overload
    def run(self, feeds: Mapping[str, Any], *, output_names: Sequence[str] | None = None,
            priority: Priority | int = ..., zero_copy: Literal[False] = False) -> dict[str, np.ndarray]: ...

    @overload
    def run(self, feeds: Mapping[str, Any], *, output_names: Sequence[str] | None = None,
            priority: Priority | int = ..., zero_copy: Literal[True]) -> Outputs: ...

    @overload
    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], *,
            priority: Priority | int = ..., zero_copy: Literal[False] = False) -> list[np.ndarray]: ...

    @overload
    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], *,
            priority: Priority | int = ..., zero_copy: Literal[True]) -> Outputs: ...

    @overload
    def run(self, *args: Any, priority: Priority | int = ..., zero_copy: bool = ...,
            **kwargs: Any) -> dict[str, np.ndarray] | list[np.ndarray] | Outputs: ...

    def run(self, *args: Any, **kwargs: Any) -> dict[str, np.ndarray] | list[np.ndarray] | Outputs:
        """:meth:`Session.run`, blocking (the same forms; ``priority=`` and ``zero_copy=`` as there).

        :raises RuntimeStateError: the SyncSession is not open.
        """
        session = self._session
        result: dict[str, np.ndarray] | list[np.ndarray] | Outputs = self._require_portal().call(
            lambda: session.run(*args, **kwargs))
        return result

    def profile(self, feeds: Mapping[str, Any] | None = None, *, repeats: int = 3) -> CostTable:
        """:meth:`Session.profile`, blocking.

        :raises RuntimeStateError: the SyncSession is not open.
        """
        table: CostTable = self._require_portal().call(lambda: self._session.profile(feeds, repeats=repeats))
        return table

    @contextlib.contextmanager
    def map(self, source: Iterable[Mapping[str, Any]], **kwargs: Any) -> Iterator[Iterator[Any]]:
        """:meth:`Session.map`, blocking (same keywords)::

            with s.map(frames) as results:
                for out in results:
                    use(out)

        ``source`` is iterated on the session's event-loop thread.

        :raises RuntimeStateError: the SyncSession is not open.
        """
        portal = self._require_portal()
        stream = self._session.map(source, **kwargs)

        def results() -> Iterator[Any]:
            while True:
                try:
                    yield portal.call(stream.__anext__)
                except StopAsyncIteration:
                    return

        with portal.wrap_async_context_manager(stream):
            yield results()

    def statistics(self) -> SessionStatistics:
        return self._session.statistics()
