"""The few Python 3.11 names hetsched uses, on 3.10 too (JetPack 6 ships Python 3.10).

``StrEnum`` on 3.10 is a ``(str, Enum)`` whose ``str()`` and ``format()`` give the member's value,
as 3.11's ``enum.StrEnum`` does (a bare ``(str, Enum)`` prints ``Class.MEMBER`` in f-strings on
3.11+); ``BaseExceptionGroup`` comes from the ``exceptiongroup`` backport (anyio's own dependency on
3.10); ``add_note`` stores notes in ``__notes__``, which 3.11's and the backport's tracebacks print.
"""

from __future__ import annotations

import sys
from enum import Enum

__all__ = ["BaseExceptionGroup", "Self", "StrEnum", "add_note"]

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup
    from enum import StrEnum
    from typing import Self
else:  # pragma: no cover - exercised by CI's Python 3.10 run
    from exceptiongroup import BaseExceptionGroup
    from typing_extensions import Self

    class StrEnum(str, Enum):
        """``enum.StrEnum`` of Python 3.11: members are strings and print as their value."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, spec: str) -> str:
            return str.__format__(str.__str__(self), spec)

        @staticmethod
        def _generate_next_value_(name: str, start: int, count: int, last_values: list[str]) -> str:
            return name.lower()


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11), on 3.10 too."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:  # pragma: no cover - exercised by CI's Python 3.10 run
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            exc.__notes__ = notes  # type: ignore[attr-defined]
        notes.append(note)
