"""Runtime internals: memory domains, zero-copy buffer pools, the transfer engine and the scheduler.

Internal package: the public names are re-exported by :mod:`hetsched`.
"""

from ._buffers import (
    ALIGNMENT,
    SLAB_BYTES,
    BufferPool,
    BufferState,
    LeakedBuffer,
    PoolStatistics,
    SharedHandle,
    TensorBuffer,
    pools_for,
    size_class,
)
from ._domains import MemoryDomain, MemoryKind, Topology
from ._scheduler import StageIO
from ._transfer import (
    ChannelStatistics,
    CopyFn,
    TransferEngine,
    TransferHooks,
    TransferInfo,
    TransferStatistics,
    rate_limited_copy,
)

__all__ = [
    "ALIGNMENT",
    "SLAB_BYTES",
    "BufferPool",
    "BufferState",
    "ChannelStatistics",
    "CopyFn",
    "LeakedBuffer",
    "MemoryDomain",
    "MemoryKind",
    "PoolStatistics",
    "SharedHandle",
    "StageIO",
    "TensorBuffer",
    "Topology",
    "TransferEngine",
    "TransferHooks",
    "TransferInfo",
    "TransferStatistics",
    "pools_for",
    "rate_limited_copy",
    "size_class",
]
