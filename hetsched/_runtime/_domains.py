"""Memory domains and the topology that says how they are connected.

A *memory domain* is a place a tensor can live: host DRAM, a device's own
memory, an NPU's SRAM-like tier. Two domains either share physical memory (on
unified-memory SoCs such as RK3588 and Jetson Orin the GPU and NPU use the same
DRAM as the CPU) or need a real copy through a *transfer channel*.

Sharing is an equivalence relation (if the GPU and the NPU both share the
host's DRAM they share it with each other), so the topology keeps *groups* of
domains that share memory; a tensor moving inside a group is mapped, never
copied. Every pair that is not in one group is served by a channel; by default
each unordered pair gets its own channel, and several pairs may be routed over
one named channel (one DMA engine serving several links).

A discrete NVIDIA GPU's memory is the ``cuda`` domain (``cuda:N`` for device N; see
:meth:`MemoryDomain.cuda` and :meth:`Topology.discrete_cuda`): its pool allocates with
``cudaMalloc`` and the transfer engine copies to and from it with ``cudaMemcpyAsync``. A
Jetson's GPU needs no such domain: it shares the host's DRAM and uses pool buffers in place.

Nothing here does I/O: a topology is plain data that the buffer pools and the
transfer engine consult.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .._compat import StrEnum
from .._errors import TransferError

__all__ = ["MemoryDomain", "MemoryKind", "Topology"]


class MemoryKind(StrEnum):
    """What kind of memory a domain is (informative; behaviour comes from the topology)."""

    HOST = "host"
    """Host DRAM, reachable by the CPUs."""
    DEVICE = "device"
    """A device's own memory (a discrete GPU's VRAM, an accelerator's carve-out)."""
    SRAM = "sram"
    """A small on-chip tier (NPU SRAM, DLA managed SRAM)."""


@dataclass(frozen=True, slots=True)
class MemoryDomain:
    """A named place tensors live in. Equal by name and kind; hashable."""

    name: str
    kind: MemoryKind = MemoryKind.HOST

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise TransferError(f"a memory domain needs a non-empty name, got {self.name!r}")

    def __str__(self) -> str:
        return self.name

    @classmethod
    def cuda(cls, device_id: int = 0) -> MemoryDomain:
        """The memory of discrete CUDA device ``device_id`` (``cuda``, ``cuda:N`` for N > 0).

        :raises TransferError: ``device_id`` is negative.
        """
        if device_id < 0:
            raise TransferError(f"a CUDA device number is >= 0, got {device_id}")
        return cls("cuda" if device_id == 0 else f"cuda:{device_id}", MemoryKind.DEVICE)


DomainLike = MemoryDomain | str


class Topology:
    """Which memory domains exist, which share DRAM, and which channel links the others.

    :param domains: the domains; names must be unique.
    :param shared: groups of domains that share physical memory (each an iterable of
        domains or names). Groups that overlap are merged, because sharing is transitive.
    :param channels: optional routing ``{(a, b): channel_name}`` for pairs that need a copy;
        the pair is unordered. Pairs not listed get their own channel named ``"a<->b"``
        (names sorted, so both directions use the same channel).
    :raises TransferError: a domain name is repeated or a group/route names an unknown
        domain, or a route is given for a pair that shares memory.
    """

    __slots__ = ("_by_name", "_group", "_routes")

    def __init__(
        self,
        domains: Iterable[MemoryDomain],
        *,
        shared: Iterable[Iterable[DomainLike]] = (),
        channels: Mapping[tuple[DomainLike, DomainLike], str] | None = None,
    ) -> None:
        self._by_name: dict[str, MemoryDomain] = {}
        for d in domains:
            if d.name in self._by_name:
                raise TransferError(f"memory domain {d.name!r} is listed twice")
            self._by_name[d.name] = d
        # union-find over names; a domain's group id is its root name
        parent = {n: n for n in self._by_name}

        def find(n: str) -> str:
            while parent[n] != n:
                parent[n] = parent[parent[n]]
                n = parent[n]
            return n

        for group in shared:
            names = [self.domain(x).name for x in group]
            for other in names[1:]:
                parent[find(other)] = find(names[0])
        self._group = {n: find(n) for n in self._by_name}
        self._routes: dict[frozenset[str], str] = {}
        for (a, b), name in (channels or {}).items():
            da, db = self.domain(a), self.domain(b)
            if self.shares_memory(da, db):
                raise TransferError(f"{da.name!r} and {db.name!r} share memory; they need no channel {name!r}")
            self._routes[frozenset((da.name, db.name))] = name

    # -- constructors ------------------------------------------------------

    @classmethod
    def host_only(cls, name: str = "host") -> Topology:
        """One host domain: everything is mapped, nothing is ever copied."""
        return cls([MemoryDomain(name, MemoryKind.HOST)])

    @classmethod
    def unified(
        cls,
        host: str = "host",
        devices: Iterable[str] = ("gpu", "npu"),
        *,
        private: Iterable[tuple[str, MemoryKind]] = (),
    ) -> Topology:
        """A unified-memory SoC (RK3588, Orin): the host and ``devices`` share DRAM.

        ``private`` adds domains that do not share it (an NPU SRAM tier, say), which
        are reached through channels.
        """
        dram = [MemoryDomain(host, MemoryKind.HOST), *(MemoryDomain(d, MemoryKind.DEVICE) for d in devices)]
        own = [MemoryDomain(n, MemoryKind(k)) for n, k in private]
        return cls([*dram, *own], shared=[dram])

    @classmethod
    def discrete(cls, host: str = "host", devices: Iterable[str] = ("gpu",)) -> Topology:
        """Every device has its own memory: each host<->device pair needs a copy."""
        return cls([MemoryDomain(host, MemoryKind.HOST), *(MemoryDomain(d, MemoryKind.DEVICE) for d in devices)])

    @classmethod
    def discrete_cuda(cls, host: str = "host", devices: Iterable[int] = (0,)) -> Topology:
        """A host with discrete CUDA GPUs: each GPU's memory is a ``cuda`` domain reached by copies
        (the pools of those domains hold ``cudaMalloc`` memory, see ``_memory``)."""
        return cls([MemoryDomain(host, MemoryKind.HOST), *(MemoryDomain.cuda(d) for d in devices)])

    # -- queries -----------------------------------------------------------

    @property
    def domains(self) -> tuple[MemoryDomain, ...]:
        """All domains, in the order given."""
        return tuple(self._by_name.values())

    def domain(self, d: DomainLike) -> MemoryDomain:
        """The domain called ``d`` (or ``d`` itself, checked).

        :raises TransferError: no such domain in this topology.
        """
        name = d.name if isinstance(d, MemoryDomain) else d
        try:
            found = self._by_name[name]
        except (KeyError, TypeError):
            raise TransferError(
                f"unknown memory domain {name!r}; this topology has {sorted(self._by_name)}"
            ) from None
        if isinstance(d, MemoryDomain) and d != found:
            raise TransferError(f"memory domain {d!r} does not match the topology's {found!r}")
        return found

    def shares_memory(self, a: DomainLike, b: DomainLike) -> bool:
        """True when a tensor in ``a`` can be used in ``b`` without a copy (same DRAM).

        :raises TransferError: either domain is unknown.
        """
        return self._group[self.domain(a).name] == self._group[self.domain(b).name]

    def channel(self, a: DomainLike, b: DomainLike) -> str | None:
        """The channel a copy between ``a`` and ``b`` goes through; None when they share memory.

        :raises TransferError: either domain is unknown.
        """
        na, nb = self.domain(a).name, self.domain(b).name
        if self._group[na] == self._group[nb]:
            return None
        route = self._routes.get(frozenset((na, nb)))
        if route is not None:
            return route
        lo, hi = sorted((na, nb))
        return f"{lo}<->{hi}"

    def __repr__(self) -> str:
        groups: dict[str, list[str]] = {}
        for n, g in self._group.items():
            groups.setdefault(g, []).append(n)
        return f"Topology(shared={sorted(groups.values())!r})"
