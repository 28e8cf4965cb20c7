"""Clock domains and operating points (one frequency per domain), as plain data."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from .._errors import UnsupportedFrequencyError

__all__ = ["DomainSpec", "OperatingPoint", "max_point", "min_point"]

DomainKind = Literal["cpu", "gpu", "npu", "memory"]

#: Used only when the board does not publish a transition latency (devfreq has no
#: such file). Generic per kind, not per board: the order of magnitude the
#: reference gives (CPU ~0.1 ms, GPU ~5 ms, EMC ~8 ms on Orin).
DEFAULT_LATENCY_S: Mapping[str, float] = {"cpu": 1e-4, "gpu": 5e-3, "npu": 1e-3, "memory": 8e-3}


@dataclass(frozen=True)
class DomainSpec:
    """One clock domain the governor may set.

    :param available_hz: ascending, unique, non-empty.
    :param transition_latency_s: how long a frequency change takes to be effective.
    :raises UnsupportedFrequencyError: ``available_hz`` is empty or not ascending.
    """

    name: str
    kind: DomainKind
    available_hz: tuple[int, ...]
    transition_latency_s: float

    def __post_init__(self) -> None:
        hz = self.available_hz
        if not hz or any(b <= a for a, b in itertools.pairwise(hz)):
            raise UnsupportedFrequencyError(
                f"domain {self.name!r}: available frequencies must be non-empty and ascending, got {hz!r}"
            )

    @property
    def min_hz(self) -> int:
        return self.available_hz[0]

    @property
    def max_hz(self) -> int:
        return self.available_hz[-1]

    def check(self, hz: int) -> int:
        """Return ``hz`` if available. :raises UnsupportedFrequencyError: otherwise (lists the table)."""
        if hz not in self.available_hz:
            raise UnsupportedFrequencyError(
                f"{hz} Hz is not available on {self.name}; available: {' '.join(map(str, self.available_hz))}"
            )
        return hz

    def index(self, hz: int) -> int:
        """Position of ``hz`` in the table. :raises UnsupportedFrequencyError: not available."""
        return self.available_hz.index(self.check(hz))

    def at_least(self, hz: float) -> int:
        """The lowest available frequency >= ``hz`` (the top one if none is)."""
        i = bisect.bisect_left(self.available_hz, hz)
        return self.available_hz[min(i, len(self.available_hz) - 1)]

    def lower(self, hz: int) -> int | None:
        """The next available frequency below ``hz``, or None at the bottom."""
        i = bisect.bisect_left(self.available_hz, hz)
        return self.available_hz[i - 1] if i > 0 else None


@dataclass(frozen=True)
class OperatingPoint:
    """One frequency per domain (Hz), immutable and hashable.

    Build with ``OperatingPoint.of({"gpu": 612_000_000, ...})``.
    """

    items_: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, freqs: Mapping[str, int] | Iterable[tuple[str, int]]) -> OperatingPoint:
        pairs = freqs.items() if isinstance(freqs, Mapping) else freqs
        return cls(tuple(sorted((str(k), int(v)) for k, v in pairs)))

    def __getitem__(self, domain: str) -> int:
        for name, hz in self.items_:
            if name == domain:
                return hz
        raise KeyError(domain)

    def get(self, domain: str, default: int | None = None) -> int | None:
        try:
            return self[domain]
        except KeyError:
            return default

    def __contains__(self, domain: object) -> bool:
        return any(name == domain for name, _ in self.items_)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self.items_)

    def __len__(self) -> int:
        return len(self.items_)

    def items(self) -> tuple[tuple[str, int], ...]:
        return self.items_

    def as_dict(self) -> dict[str, int]:
        return dict(self.items_)

    def with_(self, domain: str, hz: int) -> OperatingPoint:
        """A copy with ``domain`` set to ``hz``."""
        d = self.as_dict()
        d[domain] = int(hz)
        return OperatingPoint.of(d)

    def validate(self, domains: Mapping[str, DomainSpec]) -> OperatingPoint:
        """Return self if every frequency is available on its domain.

        :raises UnsupportedFrequencyError: an unknown domain or a frequency not in its table.
        """
        for name, hz in self.items_:
            if name not in domains:
                raise UnsupportedFrequencyError(f"operating point names unknown domain {name!r}; known: {sorted(domains)}")
            domains[name].check(hz)
        return self

    def __str__(self) -> str:
        return " ".join(f"{name}={hz / 1e6:g}MHz" for name, hz in self.items_)


def max_point(domains: Mapping[str, DomainSpec]) -> OperatingPoint:
    """Every domain at its highest frequency (what ``performance`` / jetson_clocks does)."""
    return OperatingPoint.of({n: d.max_hz for n, d in domains.items()})


def min_point(domains: Mapping[str, DomainSpec]) -> OperatingPoint:
    """Every domain at its lowest frequency (``powersave``)."""
    return OperatingPoint.of({n: d.min_hz for n, d in domains.items()})
