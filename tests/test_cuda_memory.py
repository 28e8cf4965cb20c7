"""GPU memory without a GPU: pool mappings registered with CUDA (Jetson zero-copy), TensorRT
stages bound in place, the ``cuda`` memory domain's chunked copies on priority streams.

No machine this project tests on has CUDA. ``_RecordingCudart`` is a **plumbing stand-in, not
CUDA**: "device memory" is ctypes memory of this process, a copy is a memmove, a registration is
an entry in a dict. It records which documented runtime calls are made, with which flags, in
which order and on which stream; it proves nothing about what a GPU does. The tests marked
``gpu`` use the real cuda-python and are skipped without it and a CUDA device.
"""

from __future__ import annotations

import ctypes
import sys
import types
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest

from hetsched import BackendError, BackendUnavailableError, PlatformError, Priority, TransferError
from hetsched._memory import cuda as _cuda
from hetsched._memory.cuda import HOST_MAPPINGS, CudaError, cuda_call, load_cudart
from hetsched._runtime import BufferPool, MemoryDomain, Topology, TransferEngine, pools_for
from hetsched._runtime._cuda_memory import PriorityStreams, stream_priority
from hetsched.backends import Device
from hetsched.backends._tensorrt_run import WorkerContext
from hetsched.backends.tensorrt import TensorRtStage

_OK = "cudaSuccess"
_DEVICE_OFFSET = 1 << 56  # above every user-space address (48-bit virtual addresses at most)
"""The stand-in's mapped device pointers are the host address plus this, so a test can tell
which of the two a binding used."""


class _RecordingCudart:
    """Plumbing stand-in, not CUDA (see the module docstring)."""

    cudaError_t = types.SimpleNamespace(cudaSuccess=_OK)
    cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice="H2D", cudaMemcpyDeviceToHost="D2H",
                                           cudaMemcpyDeviceToDevice="D2D", cudaMemcpyHostToHost="H2H")
    cudaHostRegisterPortable = 1  # CUDA's names
    cudaHostRegisterMapped = 2
    cudaStreamNonBlocking = 1

    def __init__(self, priority_range: tuple[int, int] = (0, -5), fail: dict[str, str] | None = None) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.registered: dict[int, tuple[int, int]] = {}  # host base -> (size, flags)
        self.device: dict[int, Any] = {}  # cudaMalloc'd / cudaMallocHost'd ctypes buffers by address
        self.pinned: set[int] = set()  # the cudaMallocHost'd ones
        self.streams: dict[str, int] = {}  # stream -> priority
        self.range = priority_range
        self.fail = fail or {}
        self.on_copy: Any = None

    def _result(self, call: str, *values: Any) -> tuple[Any, ...]:
        self.log.append((call, *values))
        if call in self.fail:
            return (self.fail[call], *(0 for _ in values))
        return (_OK, *values)

    def host_of(self, address: int) -> int:
        return address - _DEVICE_OFFSET if address >= _DEVICE_OFFSET else address

    def cudaSetDevice(self, i: int) -> tuple[Any, ...]:
        return (_OK,)

    def cudaHostRegister(self, base: int, size: int, flags: int) -> tuple[Any, ...]:
        if base in self.registered:
            return ("cudaErrorHostMemoryAlreadyRegistered",)
        self.log.append(("cudaHostRegister", base, size, flags))
        if "cudaHostRegister" in self.fail:
            return (self.fail["cudaHostRegister"],)
        self.registered[base] = (size, flags)
        return (_OK,)

    def cudaHostUnregister(self, base: int) -> tuple[Any, ...]:
        self.log.append(("cudaHostUnregister", base))
        return (_OK,) if self.registered.pop(base, None) else ("cudaErrorHostMemoryNotRegistered",)

    def cudaHostGetDevicePointer(self, host: int, flags: int) -> tuple[Any, ...]:
        # cudaMallocHost memory is mapped too (with unified addressing cudaHostAlloc's default is
        # mapped and portable); registered memory only with cudaHostRegisterMapped
        mapped = host in self.pinned or (host in self.registered and self.registered[host][1] & 2)
        assert mapped, "neither cudaMallocHost'd nor registered as mapped"
        return self._result("cudaHostGetDevicePointer", host + _DEVICE_OFFSET)

    def _alloc(self, call: str, n: int) -> tuple[Any, ...]:
        if call in self.fail:
            self.log.append((call, n))
            return (self.fail[call], 0)
        buf = ctypes.create_string_buffer(n)
        self.device[ctypes.addressof(buf)] = buf
        self.log.append((call, n))
        return (_OK, ctypes.addressof(buf))

    def cudaMalloc(self, n: int) -> tuple[Any, ...]:
        return self._alloc("cudaMalloc", n)

    def cudaMallocHost(self, n: int) -> tuple[Any, ...]:
        out = self._alloc("cudaMallocHost", n)
        self.pinned.add(out[1])
        return out

    def cudaFree(self, p: int) -> tuple[Any, ...]:
        self.log.append(("cudaFree", p))
        self.device.pop(p)
        return (_OK,)

    cudaFreeHost = cudaFree

    def cudaDeviceGetStreamPriorityRange(self) -> tuple[Any, ...]:
        return self._result("cudaDeviceGetStreamPriorityRange", *self.range)

    def cudaStreamCreateWithPriority(self, flags: int, priority: int) -> tuple[Any, ...]:
        name = f"stream{len(self.streams)}"
        self.streams[name] = priority
        return self._result("cudaStreamCreateWithPriority", name)

    def cudaStreamCreate(self) -> tuple[Any, ...]:
        return self._result("cudaStreamCreate", "ctx-stream")

    def cudaStreamDestroy(self, s: str) -> tuple[Any, ...]:
        self.log.append(("cudaStreamDestroy", s))
        return (_OK,)

    def cudaMemcpyAsync(self, dst: int, src: int, n: int, kind: str, stream: str) -> tuple[Any, ...]:
        self.log.append(("cudaMemcpyAsync", kind, n, stream))
        if "cudaMemcpyAsync" in self.fail:
            return (self.fail["cudaMemcpyAsync"],)
        ctypes.memmove(self.host_of(dst), self.host_of(src), n)
        if self.on_copy is not None:
            self.on_copy()
        return (_OK,)

    def cudaStreamSynchronize(self, s: str) -> tuple[Any, ...]:
        return self._result("cudaStreamSynchronize", s)

    def calls(self, name: str) -> list[tuple[Any, ...]]:
        return [c for c in self.log if c[0] == name]


@pytest.fixture
def cudart(monkeypatch: pytest.MonkeyPatch) -> Iterator[_RecordingCudart]:
    rt = _RecordingCudart()
    monkeypatch.setattr(_cuda, "load_cudart", lambda: rt)
    yield rt
    assert rt.registered == {}, "a registration outlived its pool"


# -- loading and errors ---------------------------------------------------------------------------


def test_missing_cuda_python_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for mod in ("cuda", "cuda.bindings", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(BackendUnavailableError, match=r"cuda-python.*pip install 'hetsched\[jetson-cuda12\]'"):
        load_cudart()
    with pytest.raises(PlatformError, match=r"'cuda' is CUDA device memory.*hetsched\[jetson-cuda12\]"):
        BufferPool(MemoryDomain.cuda(), root=tmp_path)


def test_a_cuda_error_is_a_backend_error_naming_the_call() -> None:
    rt = _RecordingCudart()
    assert cuda_call(rt, (_OK, 5), "cudaMalloc") == 5
    with pytest.raises(CudaError, match="cudaMalloc failed: cudaErrorMemoryAllocation") as err:
        cuda_call(rt, ("cudaErrorMemoryAllocation", 0), "cudaMalloc")
    assert isinstance(err.value, BackendError) and err.value.call == "cudaMalloc"


def test_cuda_domain_names() -> None:
    assert MemoryDomain.cuda().name == "cuda" and MemoryDomain.cuda(1).name == "cuda:1"
    with pytest.raises(TransferError, match="-1"):
        MemoryDomain.cuda(-1)
    topo = Topology.discrete_cuda(devices=(0, 1))
    assert topo.channel("host", "cuda") == "cuda<->host" and not topo.shares_memory("cuda", "cuda:1")


# -- pool mappings registered with CUDA (Jetson: the GPU uses pool buffers in place) --------------


def test_a_pool_mapping_is_registered_once_and_unregistered_when_the_pool_closes(
        cudart: _RecordingCudart, tmp_path: Any) -> None:
    pool = BufferPool("host", root=tmp_path)
    a = pool.acquire_nowait((np.float32, (2, 64)))
    b = pool.acquire_nowait((np.float32, (2, 64)))  # the same size class: the same slab
    da = HOST_MAPPINGS.device_address(cudart, a.ptr, a.nbytes, mapped=True)
    db = HOST_MAPPINGS.device_address(cudart, b.ptr, b.nbytes, mapped=True)
    ((_, base, size, flags),) = cudart.calls("cudaHostRegister")
    assert flags == 1 | 2 and base <= a.ptr < base + size and HOST_MAPPINGS.registered() == 1
    assert (da, db) == (a.ptr + _DEVICE_OFFSET, b.ptr + _DEVICE_OFFSET)  # the device pointer, offset kept
    a.release()
    b.release()
    pool.close()
    assert cudart.calls("cudaHostUnregister") == [("cudaHostUnregister", base)]
    assert HOST_MAPPINGS.registered() == 0


def test_memory_that_is_not_a_pools_is_never_registered(cudart: _RecordingCudart) -> None:
    arr = np.zeros(1024, np.float32)
    assert HOST_MAPPINGS.device_address(cudart, arr.ctypes.data, arr.nbytes, mapped=True) is None
    assert cudart.log == []


def test_a_half_made_registration_is_undone(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    rt = _RecordingCudart(fail={"cudaHostGetDevicePointer": "cudaErrorInvalidValue"})
    with BufferPool("host", root=tmp_path) as pool:
        buf = pool.acquire_nowait((np.uint8, (4096,)))
        with caplog.at_level("WARNING", logger="hetsched.backends"):
            assert HOST_MAPPINGS.device_address(rt, buf.ptr, buf.nbytes, mapped=True) is None
        assert "cudaHostGetDevicePointer failed: cudaErrorInvalidValue" in caplog.text
        assert rt.registered == {} and len(rt.calls("cudaHostUnregister")) == 1
        buf.release()
    assert HOST_MAPPINGS.registered() == 0


def test_a_refused_registration_is_not_retried_and_the_stage_copies_instead(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    rt = _RecordingCudart(fail={"cudaHostRegister": "cudaErrorNotSupported"})
    with BufferPool("host", root=tmp_path) as pool:
        x, y = pool.acquire_nowait((np.float32, (2, 64))), pool.acquire_nowait((np.float32, (2, 64)))
        x.array()[:] = 4.0
        ctx = WorkerContext(rt, _handle(rt), 0, integrated=True)
        with caplog.at_level("WARNING", logger="hetsched.backends"):
            ctx.run({"x": x.array()}, [y.array()])
            ctx.run({"x": x.array()}, [y.array()])
        np.testing.assert_array_equal(y.array(), 8.0)
        assert (ctx.bound, ctx.staged) == (0, 4) and len(rt.calls("cudaHostRegister")) == 1
        assert caplog.text.count("cudaHostRegister failed: cudaErrorNotSupported") == 1
        ctx.close()
        x.release()
        y.release()
    assert rt.registered == {} and rt.device == {}


class _CopyContext:
    """Plumbing stand-in for an execution context, not TensorRT: "runs" by doubling input x into y,
    reading and writing through the addresses it was bound (device pointers mapped back to host)."""

    def __init__(self, cudart: _RecordingCudart) -> None:
        self.cudart = cudart
        self.addr: dict[str, int] = {}
        self.shape: tuple[int, ...] = (0,)

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shape = shape
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shape

    def set_tensor_address(self, name: str, ptr: int) -> None:
        self.addr[name] = ptr

    def execute_async_v3(self, *, stream_handle: Any) -> bool:
        n = int(np.prod(self.shape))
        x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(self.cudart.host_of(self.addr["x"])))
        y = np.ctypeslib.as_array((ctypes.c_float * n).from_address(self.cudart.host_of(self.addr["y"])))
        y[:] = 2 * x
        return True


def _handle(cudart: _RecordingCudart, out_shape: tuple[int, ...] = (2, 64)) -> Any:
    engine = types.SimpleNamespace(create_execution_context=lambda: _CopyContext(cudart),
                                   get_tensor_shape=lambda name: out_shape)
    f32 = np.dtype(np.float32)
    return types.SimpleNamespace(engine=engine, inputs=("x",), outputs=("y",), dtypes={"x": f32, "y": f32})


def test_an_integrated_gpu_reads_and_writes_pool_buffers_in_place(cudart: _RecordingCudart, tmp_path: Any) -> None:
    pool = BufferPool("host", root=tmp_path)
    x, y = pool.acquire_nowait((np.float32, (2, 64))), pool.acquire_nowait((np.float32, (2, 64)))
    x.array()[:] = np.arange(128, dtype=np.float32).reshape(2, 64)
    ctx = WorkerContext(cudart, _handle(cudart), 0, integrated=True)
    assert ctx.run({"x": x.array()}, [y.array()]) == []
    np.testing.assert_array_equal(y.array(), 2 * x.array())
    assert ctx.context.addr == {"x": x.ptr + _DEVICE_OFFSET, "y": y.ptr + _DEVICE_OFFSET}  # device pointers
    assert cudart.calls("cudaMallocHost") == [] and cudart.calls("cudaMemcpyAsync") == []
    assert (ctx.bound, ctx.staged) == (2, 0)
    # a caller's own array is not a pool's: it goes through the context's pinned buffer
    (out,) = ctx.run({"x": np.ones((2, 64), np.float32)})
    np.testing.assert_array_equal(out, 2 * np.ones((2, 64), np.float32))
    assert (ctx.bound, ctx.staged) == (2, 2) and len(cudart.calls("cudaMallocHost")) == 2
    ctx.close()
    assert cudart.device == {}  # the context's pinned buffers are freed; the pool's mapping is the pool's
    assert HOST_MAPPINGS.registered() == 1
    x.release()
    y.release()
    pool.close()


def test_a_discrete_gpu_copies_straight_between_pinned_pool_buffers_and_device_memory(
        cudart: _RecordingCudart, tmp_path: Any) -> None:
    with BufferPool("host", root=tmp_path) as pool:
        x, y = pool.acquire_nowait((np.float32, (2, 64))), pool.acquire_nowait((np.float32, (2, 64)))
        x.array()[:] = 3.0
        ctx = WorkerContext(cudart, _handle(cudart), 0, integrated=False)
        ctx.run({"x": x.array()}, [y.array()])
        np.testing.assert_array_equal(y.array(), 6.0)
        ((*_, flags),) = cudart.calls("cudaHostRegister")
        assert flags == 1 and (ctx.bound, ctx.pinned, ctx.staged) == (0, 2, 0)  # pinned, not mapped
        copies = cudart.calls("cudaMemcpyAsync")
        assert [c[1:3] for c in copies] == [("H2D", 512), ("D2H", 512)]
        assert cudart.calls("cudaMallocHost") == [] and len(cudart.calls("cudaMalloc")) == 2
        assert ctx.context.addr["x"] != x.ptr  # device memory, not the host buffer, is bound
        ctx.close()
        assert cudart.device == {}
        x.release()
        y.release()


def test_a_failed_run_leaks_nothing(cudart: _RecordingCudart, tmp_path: Any) -> None:
    pool = BufferPool("host", root=tmp_path)
    x, y = pool.acquire_nowait((np.float32, (2, 64))), pool.acquire_nowait((np.float32, (2, 64)))
    handle = _handle(cudart)
    ctx = WorkerContext(cudart, handle, 0, integrated=True)
    ctx.context.execute_async_v3 = lambda **kw: False  # TensorRT refusing the run
    with pytest.raises(RuntimeError, match="execute_async_v3 failed"):
        ctx.run({"x": x.array()}, [y.array()])
    ctx.close()
    x.release()
    y.release()
    pool.close()  # the fixture checks no registration outlives the pool


def _stage(cudart: _RecordingCudart, out_shape: tuple[int, ...] = (2, 64)) -> TensorRtStage:
    gpu = types.SimpleNamespace(integrated=True)
    stage = TensorRtStage(None, cudart, None, b"", name="s0", device=Device("gpu", kind="gpu", backend="tensorrt"),
                          device_id=0, gpu=gpu,  # type: ignore[arg-type]  # the one field the stage reads
                          dla_core=None, precision="fp32",
                          key="k", cached=False, input_names=["x"], output_names=["y"])
    stage._handle = _handle(cudart, out_shape)  # the engine stand-in, as if deserialized
    return stage


def test_the_tensorrt_stage_is_bindable_with_static_outputs(cudart: _RecordingCudart, tmp_path: Any) -> None:
    from hetsched.backends import BindableStage, WorkerInfo

    stage = _stage(cudart)
    assert isinstance(stage, BindableStage)
    assert stage.output_specs() == [(np.dtype(np.float32), (2, 64))]
    assert _stage(cudart, (-1, 64)).output_specs() is None  # sized at run time: not bindable
    with BufferPool("host", root=tmp_path) as pool:
        x, y = pool.acquire_nowait((np.float32, (2, 64))), pool.acquire_nowait((np.float32, (2, 64)))
        x.array()[:] = 1.5
        state = stage.worker_state(WorkerInfo("gpu", 0, ()))
        stage.run_into({"x": x.array()}, [y.array()], state=state)
        np.testing.assert_array_equal(y.array(), 3.0)
        stats = stage.statistics()
        assert (stats.runs, stats.bound_tensors, stats.pinned_tensors, stats.staged_tensors) == (1, 2, 0, 0)
        stage.close_worker_state(state)
        stage.close()
        x.release()
        y.release()
    assert ("cudaStreamDestroy", "ctx-stream") in cudart.log


# -- the cuda memory domain: copies through the transfer engine on priority streams ---------------


def test_stream_priorities_span_the_devices_range() -> None:
    assert [stream_priority(p, 0, -5) for p in Priority] == [-5, -5, -2, 0]
    assert [stream_priority(p, 0, 0) for p in Priority] == [0, 0, 0, 0]  # no priorities on this device
    rt = _RecordingCudart((0, -1))
    streams = PriorityStreams(rt)
    assert rt.streams[streams.stream_for(Priority.HIGH)] == -1
    assert rt.streams[streams.stream_for(Priority.BACKGROUND)] == 0
    streams.close()
    assert len(rt.calls("cudaStreamDestroy")) == len(rt.streams)


@pytest.fixture
def cuda_pools(cudart: _RecordingCudart, tmp_path: Any) -> Iterator[tuple[Topology, dict[str, BufferPool]]]:
    topo = Topology.discrete_cuda()
    pools = pools_for(topo, root=tmp_path)
    assert pools["cuda"].backing == "cuda" and pools["host"].backing != "cuda"
    yield topo, pools
    for p in pools.values():
        p.close()
    assert cudart.device == {}  # every cudaMalloc'd slab was freed


@pytest.mark.anyio
async def test_host_to_cuda_and_back_in_chunks(cudart: _RecordingCudart,
                                               cuda_pools: tuple[Topology, dict[str, BufferPool]]) -> None:
    topo, pools = cuda_pools
    src = pools["host"].acquire_nowait((np.uint8, (10_000,)))
    src.array()[:] = np.arange(10_000) % 251
    async with TransferEngine(topo, pools, chunk_bytes=4096) as eng:
        dev = await eng.transfer(src, "cuda", priority=Priority.NORMAL)
        with pytest.raises(TransferError, match="GPU memory and has no host view"):
            dev.array()
        back = await eng.transfer(dev, "host", priority=Priority.NORMAL)
    np.testing.assert_array_equal(back.array(), np.arange(10_000) % 251)
    copies = cudart.calls("cudaMemcpyAsync")
    assert [(c[1], c[2]) for c in copies] == [("H2D", 4096), ("H2D", 4096), ("H2D", 1808),
                                              ("D2H", 4096), ("D2H", 4096), ("D2H", 1808)]
    assert len(cudart.calls("cudaStreamSynchronize")) == 6  # every chunk is waited for
    assert cudart.calls("cudaHostRegister") and all(f == 1 for *_, f in cudart.calls("cudaHostRegister"))
    assert eng.statistics().channels["cuda<->host"].chunks == 6
    for b in (src, dev, back):
        b.release()


@pytest.mark.anyio
async def test_a_high_copy_overtakes_a_background_one(cudart: _RecordingCudart,
                                                      cuda_pools: tuple[Topology, dict[str, BufferPool]]) -> None:
    topo, pools = cuda_pools
    big = pools["host"].acquire_nowait((np.uint8, (8 * 1024,)), label="big")
    small = pools["host"].acquire_nowait((np.uint8, (2 * 1024,)), label="small")
    results: dict[str, Any] = {}
    started = anyio.Event()

    def on_copy() -> None:
        if len(cudart.calls("cudaMemcpyAsync")) == 2:  # the background copy is under way
            started.set()

    cudart.on_copy = on_copy

    async def move(buf: Any, prio: Priority) -> None:
        results[buf.label] = await eng.transfer(buf, "cuda", priority=prio)

    async with TransferEngine(topo, pools, chunk_bytes=1024) as eng, anyio.create_task_group() as tg:
        tg.start_soon(move, big, Priority.BACKGROUND)
        await started.wait()
        tg.start_soon(move, small, Priority.HIGH)
    streams = [cudart.streams[c[3]] for c in cudart.calls("cudaMemcpyAsync")]
    # background chunks run on the least urgent stream (0), high ones on the most urgent (-5);
    # the high copy's two chunks come before the background copy's remaining ones
    first_high = streams.index(-5)
    assert streams[first_high:first_high + 2] == [-5, -5] and streams.count(-5) == 2
    assert streams.count(0) == 8 and first_high < len(streams) - 2
    assert eng.statistics().channels["cuda<->host"].preemptions >= 1
    for b in (big, small, *results.values()):
        b.release()


@pytest.mark.anyio
async def test_a_cancelled_cuda_copy_stops_at_a_chunk_boundary_and_frees_its_buffer(
        cudart: _RecordingCudart, cuda_pools: tuple[Topology, dict[str, BufferPool]]) -> None:
    topo, pools = cuda_pools
    src = pools["host"].acquire_nowait((np.uint8, (8 * 1024,)))
    async with TransferEngine(topo, pools, chunk_bytes=1024) as eng:
        with anyio.CancelScope() as scope:
            def on_copy() -> None:
                if len(cudart.calls("cudaMemcpyAsync")) == 3:
                    scope.cancel()

            cudart.on_copy = on_copy
            await eng.transfer(src, "cuda", priority=Priority.BACKGROUND)
    assert scope.cancelled_caught and len(cudart.calls("cudaMemcpyAsync")) == 3
    assert len(cudart.calls("cudaStreamSynchronize")) == 3  # each chunk finished before the cancel landed
    assert pools["cuda"].statistics().bytes_in_use == 0
    assert eng.statistics().channels["cuda<->host"].cancelled == 1
    src.release()


@pytest.mark.anyio
async def test_a_failed_cuda_copy_is_a_transfer_error_and_frees_the_destination(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    rt = _RecordingCudart(fail={"cudaMemcpyAsync": "cudaErrorInvalidValue"})
    monkeypatch.setattr(_cuda, "load_cudart", lambda: rt)
    topo = Topology.discrete_cuda()
    pools = pools_for(topo, root=tmp_path)
    src = pools["host"].acquire_nowait((np.uint8, (4096,)))
    async with TransferEngine(topo, pools, chunk_bytes=1024) as eng:
        with pytest.raises(TransferError, match="cudaMemcpyAsync failed: cudaErrorInvalidValue") as err:
            await eng.transfer(src, "cuda")
    assert isinstance(err.value.__cause__, CudaError)
    assert pools["cuda"].statistics().bytes_in_use == 0
    src.release()
    for p in pools.values():
        p.close()
    assert rt.device == {} and rt.registered == {}


# -- on a real CUDA GPU ----------------------------------------------------------------------------


def _cuda_reason() -> str | None:
    try:
        rt = load_cudart()
        count = cuda_call(rt, rt.cudaGetDeviceCount(), "cudaGetDeviceCount")
    except (BackendUnavailableError, CudaError) as exc:
        return str(exc)
    return None if count else "no CUDA device"


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_reason() is not None, reason=f"needs cuda-python and a CUDA GPU: {_cuda_reason()}")
def test_pool_memory_registers_and_round_trips_through_a_real_gpu(tmp_path: Any) -> None:
    async def main() -> None:
        topo = Topology.discrete_cuda()
        pools = pools_for(topo, root=tmp_path)
        src = pools["host"].acquire_nowait((np.uint8, (3 << 20,)))
        src.array()[:] = np.arange(3 << 20) % 253
        async with TransferEngine(topo, pools, chunk_bytes=1 << 20) as eng:
            dev = await eng.transfer(src, "cuda", priority=Priority.HIGH)
            back = await eng.transfer(dev, "host", priority=Priority.BACKGROUND)
        np.testing.assert_array_equal(back.array(), np.arange(3 << 20) % 253)
        assert HOST_MAPPINGS.registered() >= 1
        rt = load_cudart()
        mapped = HOST_MAPPINGS.device_address(rt, src.ptr, src.nbytes, mapped=True)
        assert mapped is not None
        for b in (src, dev, back):
            b.release()
        for p in pools.values():
            p.close()
        assert HOST_MAPPINGS.registered() == 0

    anyio.run(main)
