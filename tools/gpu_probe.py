"""hetsched's CUDA memory path on a real GPU, through its own code (no TensorRT needed).

Run by gpu_check.sh on the lent machine; safe to run anywhere: without cuda-python or a CUDA
device it prints ``SKIP: ...`` and exits 3 after the checks that need no GPU.

What it exercises, each step a JSON line (``{"step": ..., "ok": ..., ...}``) and all of them in
``$OUT/probe.json`` (or argv[1]):

 1. ``hetsched._memory.cuda.load_cudart`` (which module: cuda.bindings.runtime / cuda.cudart),
    ``_tensorrt_run.gpu_info`` (cudaGetDeviceProperties, runtime/driver versions, integrated).
 2. ``cuda_call`` with real ``cudaError_t`` enums: a refused cudaMalloc becomes ``CudaError`` whose
    ``name`` is the error's C name (the stand-in in the tests uses strings).
 3. ``HOST_MAPPINGS``: a pool slab pinned (cudaHostRegister Portable), then re-registered mapped
    (Portable|Mapped, cudaHostGetDevicePointer), then unregistered when the pool closes;
    for the memfd and the anonymous backing (gVisor may refuse one of them).
 4. ``TransferEngine`` host -> cuda -> host with ``Topology.discrete_cuda()`` at several chunk
    sizes: bytes checked exactly, and the device copy read independently (cupy / torch on the
    slab's device pointer); GB/s against plain cudaMemcpy / torch / cupy copies of the same size.
 5. Preemption: a BACKGROUND host->cuda copy under way, a HIGH one started; the HIGH one must end
    first, the channel must count a preemption, both must round-trip exactly; the CUDA priority
    of each stream the copier made (cudaStreamGetPriority).
 6. ``_tensorrt_run.WorkerContext`` (the TensorRT run path minus TensorRT): the engine is a
    stand-in whose "execute_async_v3" launches y = 2 * x with cupy on the context's stream at the
    addresses bound; discrete mode (cudaMalloc + pinned copies) and integrated mode (pool
    buffers registered Mapped and bound in place: the Jetson zero-copy path, which a discrete
    GPU with unified addressing also runs).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import tempfile
import time
import traceback
import types
from typing import Any, ClassVar

import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "probe.json")
MiB = 1 << 20
SIZE = int(os.environ.get("PROBE_MIB", "256")) * MiB
RESULTS: list[dict[str, Any]] = []
WARNINGS: list[str] = []


class _Capture(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        WARNINGS.append(f"{record.name}: {record.getMessage()}")


logging.getLogger("hetsched").addHandler(_Capture(logging.WARNING))


def report(step: str, ok: bool | None, **kw: Any) -> dict[str, Any]:
    row = {"step": step, "ok": ok, **kw}
    RESULTS.append(row)
    print(json.dumps(row, default=str), flush=True)
    return row


def save() -> None:
    os.makedirs(os.path.dirname(os.path.abspath(OUT)), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"results": RESULTS, "warnings": WARNINGS}, f, indent=1, default=str)


def step(fn):
    """Run one step; an exception is a failed step, not the end of the probe."""
    def run(*a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except Exception as exc:
            report(fn.__name__, False, error=f"{type(exc).__name__}: {exc}", tb=traceback.format_exc()[-1500:])
            return None
    return run


def gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 2) if seconds > 0 else float("nan")


def best(fn, reps: int = 3) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


# -- optional array libraries, for independent reads of device memory and baselines -----------------

def _cupy() -> Any:
    try:
        import cupy
        return cupy
    except Exception:
        return None


def _torch() -> Any:
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def device_bytes(ptr: int, nbytes: int) -> np.ndarray | None:
    """The bytes at device address ``ptr`` read with cupy (or torch), not with hetsched."""
    cp = _cupy()
    if cp is not None:
        mem = cp.cuda.UnownedMemory(ptr, nbytes, None, 0)
        arr = cp.ndarray((nbytes,), cp.uint8, cp.cuda.MemoryPointer(mem, 0))
        return cp.asnumpy(arr)
    torch = _torch()
    if torch is not None:
        class _CAI:
            __cuda_array_interface__: ClassVar[dict[str, Any]] = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}
        return torch.as_tensor(_CAI(), device="cuda").cpu().numpy()
    return None


# -- steps --------------------------------------------------------------------------------------

def versions() -> dict[str, Any]:
    v: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("cuda.bindings", "cupy", "torch", "onnx", "onnxruntime", "anyio", "pytest", "trio", "hetsched"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            v[mod] = getattr(m, "__version__", "?")
            if mod == "hetsched":
                v["hetsched_file"] = m.__file__
        except Exception as exc:
            v[mod] = f"missing ({type(exc).__name__}: {exc})"[:120]
    report("versions", True, **v)
    return v


def load() -> tuple[Any, Any] | None:
    from hetsched._memory.cuda import cuda_call, load_cudart
    try:
        rt = load_cudart()
    except Exception as exc:
        report("load_cudart", None, skip=f"{type(exc).__name__}: {exc}")
        return None
    try:
        n = cuda_call(rt, rt.cudaGetDeviceCount(), "cudaGetDeviceCount")
    except Exception as exc:
        report("load_cudart", None, module=rt.__name__, skip=f"{type(exc).__name__}: {exc}")
        return None
    report("load_cudart", True, module=rt.__name__, devices=int(n))
    return (rt, n) if n else None


@step
def gpu_info_step(rt: Any) -> Any:
    from hetsched.backends._tensorrt_run import gpu_info
    g = gpu_info(rt, 0)
    report("gpu_info", True, name=g.name, cc=g.compute_capability, cuda_runtime=g.cuda_version,
           driver=g.driver_version, integrated=g.integrated)
    return g


@step
def error_translation(rt: Any) -> None:
    from hetsched._memory.cuda import CudaError, cuda_call, device_lost
    try:
        cuda_call(rt, rt.cudaMalloc(1 << 50), "cudaMalloc")  # 1 PiB: refused, not sticky
    except CudaError as exc:
        report("error_translation", exc.name == "cudaErrorMemoryAllocation" and not device_lost(exc.name),
               call=exc.call, name=exc.name, message=str(exc))
        return
    report("error_translation", False, error="a 1 PiB cudaMalloc succeeded?")


@step
def host_registration(rt: Any, backing: str) -> None:
    from hetsched._memory.cuda import HOST_MAPPINGS
    from hetsched.lowlevel import BufferPool
    before = len(WARNINGS)
    with tempfile.TemporaryDirectory() as tmp:
        pool = BufferPool("host", root=tmp, backing=backing)
        buf = pool.acquire_nowait((np.uint8, (8 * MiB,)))
        ptr = buf.ptr
        pinned = HOST_MAPPINGS.device_address(rt, buf.ptr, buf.nbytes, mapped=False)
        n_pinned = HOST_MAPPINGS.registered()
        mapped = HOST_MAPPINGS.device_address(rt, buf.ptr, buf.nbytes, mapped=True)
        n_mapped = HOST_MAPPINGS.registered()
        # the registration is real: the pointer attributes say host memory CUDA knows
        attrs = rt.cudaPointerGetAttributes(buf.ptr)
        kind = str(getattr(attrs[1], "type", "?")) if attrs[0] == rt.cudaError_t.cudaSuccess else str(attrs[0])
        buf.release()
        pool.close()
        after = HOST_MAPPINGS.registered()
    ok = pinned == ptr and mapped is not None and n_pinned == 1 and n_mapped == 1 and after == 0
    report("host_registration", ok, backing=pool.backing, pinned_addr_is_host=pinned == ptr,
           mapped_device_addr=hex(mapped) if mapped else None, same_as_host=mapped == ptr,
           registered=(n_pinned, n_mapped, after), pointer_type=kind, warnings=WARNINGS[before:])


def _engine_round_trip(rt: Any, chunk: int, size: int) -> dict[str, Any]:
    import anyio

    from hetsched import Priority
    from hetsched._memory.cuda import HOST_MAPPINGS
    from hetsched._runtime import pools_for
    from hetsched.lowlevel import Topology, TransferEngine

    out: dict[str, Any] = {}

    async def main(tmp: str) -> None:
        topo = Topology.discrete_cuda()
        pools = pools_for(topo, root=tmp)
        src = pools["host"].acquire_nowait((np.uint8, (size,)))
        pattern = np.random.default_rng(chunk).integers(0, 256, size, dtype=np.uint8)
        src.array()[:] = pattern
        async with TransferEngine(topo, pools, chunk_bytes=chunk) as eng:
            t0 = time.perf_counter()
            dev = await eng.transfer(src, "cuda", priority=Priority.HIGH)
            t1 = time.perf_counter()
            back = await eng.transfer(dev, "host", priority=Priority.BACKGROUND)
            t2 = time.perf_counter()
            ch = eng.statistics().channels["cuda<->host"]
        on_device = device_bytes(dev.ptr, size)
        out.update(h2d_gbps=gbps(size, t1 - t0), d2h_gbps=gbps(size, t2 - t1), chunks=ch.chunks,
                   exact=bool(np.array_equal(back.array(), pattern)),
                   device_copy_exact=None if on_device is None else bool(np.array_equal(on_device, pattern)),
                   registered_during=HOST_MAPPINGS.registered(), host_backing=pools["host"].backing)
        for b in (src, dev, back):
            b.release()
        for p in pools.values():
            p.close()
        out["registered_after"] = HOST_MAPPINGS.registered()

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(main, tmp)
    return out


@step
def engine_round_trips(rt: Any) -> None:
    for chunk in (1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB):
        before = len(WARNINGS)
        r = _engine_round_trip(rt, chunk, SIZE)
        ok = r["exact"] and r["device_copy_exact"] is not False and r["registered_after"] == 0
        report("engine_round_trip", ok, chunk_mib=chunk // MiB, size_mib=SIZE // MiB, **r, warnings=WARNINGS[before:])


@step
def baselines(rt: Any) -> None:
    """The same number of bytes moved without hetsched's engine, in the same process."""
    from hetsched._memory.cuda import cuda_call
    res: dict[str, Any] = {"size_mib": SIZE // MiB}
    H2D, D2H = rt.cudaMemcpyKind.cudaMemcpyHostToDevice, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
    dptr = int(cuda_call(rt, rt.cudaMalloc(SIZE), "cudaMalloc"))
    try:
        pageable = np.ones(SIZE, np.uint8)
        res["cudart_pageable_h2d"] = gbps(SIZE, best(lambda: cuda_call(rt, rt.cudaMemcpy(dptr, pageable.ctypes.data, SIZE, H2D), "cudaMemcpy")))
        hptr = int(cuda_call(rt, rt.cudaMallocHost(SIZE), "cudaMallocHost"))
        try:
            res["cudart_pinned_h2d"] = gbps(SIZE, best(lambda: cuda_call(rt, rt.cudaMemcpy(dptr, hptr, SIZE, H2D), "cudaMemcpy")))
            res["cudart_pinned_d2h"] = gbps(SIZE, best(lambda: cuda_call(rt, rt.cudaMemcpy(hptr, dptr, SIZE, D2H), "cudaMemcpy")))
            # the engine's pattern: 1 MiB chunks, each cudaMemcpyAsync + cudaStreamSynchronize, one thread
            stream = cuda_call(rt, rt.cudaStreamCreate(), "cudaStreamCreate")

            def chunked(ch: int) -> None:
                for off in range(0, SIZE, ch):
                    cuda_call(rt, rt.cudaMemcpyAsync(dptr + off, hptr + off, min(ch, SIZE - off), H2D, stream), "cudaMemcpyAsync")
                    cuda_call(rt, rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
            res["cudart_pinned_h2d_1mib_chunks_synced"] = gbps(SIZE, best(lambda: chunked(MiB)))
            res["cudart_pinned_h2d_16mib_chunks_synced"] = gbps(SIZE, best(lambda: chunked(16 * MiB)))
            rt.cudaStreamDestroy(stream)
        finally:
            rt.cudaFreeHost(hptr)
    finally:
        rt.cudaFree(dptr)
    torch = _torch()
    if torch is not None:
        pin = torch.empty(SIZE, dtype=torch.uint8, pin_memory=True)
        page = torch.empty(SIZE, dtype=torch.uint8)
        dev = torch.empty(SIZE, dtype=torch.uint8, device="cuda")

        def tcopy(src: Any, dst: Any) -> None:
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
        res["torch_pinned_h2d"] = gbps(SIZE, best(lambda: tcopy(pin, dev)))
        res["torch_pinned_d2h"] = gbps(SIZE, best(lambda: tcopy(dev, pin)))
        res["torch_pageable_h2d"] = gbps(SIZE, best(lambda: tcopy(page, dev)))
        del pin, page, dev
    cp = _cupy()
    if cp is not None:
        host = cp.cuda.alloc_pinned_memory(SIZE)
        hview = np.frombuffer(host, np.uint8, SIZE)
        dev = cp.empty(SIZE, cp.uint8)

        def cset() -> None:
            dev.set(hview)
            cp.cuda.runtime.deviceSynchronize()
        res["cupy_pinned_h2d"] = gbps(SIZE, best(cset))
        del dev, host
    report("baselines_gbps", True, **res)


@step
def preemption(rt: Any) -> None:
    import anyio

    from hetsched import Priority
    from hetsched._runtime import pools_for
    from hetsched.lowlevel import Topology, TransferEngine

    big_n, small_n, chunk = 4 * SIZE, 16 * MiB, 1 * MiB
    out: dict[str, Any] = {}

    async def main(tmp: str) -> None:
        topo = Topology.discrete_cuda()
        pools = pools_for(topo, root=tmp)
        big = pools["host"].acquire_nowait((np.uint8, (big_n,)), label="big")
        small = pools["host"].acquire_nowait((np.uint8, (small_n,)), label="small")
        big.array()[:] = np.random.default_rng(1).integers(0, 256, big_n, dtype=np.uint8)
        small.array()[:] = np.random.default_rng(2).integers(0, 256, small_n, dtype=np.uint8)
        done: dict[str, float] = {}
        res: dict[str, Any] = {}

        async def move(buf: Any, prio: Priority) -> None:
            res[buf.label] = await eng.transfer(buf, "cuda", priority=prio)
            done[buf.label] = time.perf_counter()

        async with TransferEngine(topo, pools, chunk_bytes=chunk) as eng:
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                tg.start_soon(move, big, Priority.BACKGROUND)
                while (eng.statistics().channels.get("cuda<->host") is None  # noqa: ASYNC110 - polling counters
                       or eng.statistics().channels["cuda<->host"].chunks < 8):
                    await anyio.sleep(0.0005)
                t_high = time.perf_counter()
                chunks_before = eng.statistics().channels["cuda<->host"].chunks
                tg.start_soon(move, small, Priority.HIGH)
            ch = eng.statistics().channels["cuda<->host"]
            back_small = await eng.transfer(res["small"], "host", priority=Priority.HIGH)
            back_big = await eng.transfer(res["big"], "host", priority=Priority.NORMAL)
        copier = pools["cuda"]._backing.copier  # diagnostic: the streams it made
        prios = {}
        for level, s in copier.streams._streams.items():
            _err, p = rt.cudaStreamGetPriority(s)
            prios[str(Priority(level).name)] = int(p)
        rng = rt.cudaDeviceGetStreamPriorityRange()
        out.update(high_first=done["small"] < done["big"], preemptions=ch.preemptions, resumes=ch.resumes,
                   chunks_before_high=chunks_before, high_latency_ms=round((done["small"] - t_high) * 1e3, 2),
                   background_ms=round((done["big"] - t0) * 1e3, 1), suspended_s=round(ch.suspended_seconds, 4),
                   exact_small=bool(np.array_equal(back_small.array(), small.array())),
                   exact_big=bool(np.array_equal(back_big.array(), big.array())),
                   stream_priorities=prios, device_priority_range=[int(rng[1]), int(rng[2])],
                   high_gbps=gbps(small_n, done["small"] - t_high), big_gbps=gbps(big_n, done["big"] - t0))
        for b in (big, small, back_small, back_big, *res.values()):
            b.release()
        for p in pools.values():
            p.close()

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(main, tmp)
    ok = out["high_first"] and out["preemptions"] >= 1 and out["exact_small"] and out["exact_big"]
    report("preemption", ok, big_mib=big_n // MiB, small_mib=small_n // MiB, chunk_mib=chunk // MiB, **out)


class _CupyContext:
    """Stand-in for a TensorRT execution context: y = 2 * x on the stream it is given, reading and
    writing the device addresses it was bound (cupy kernels: real GPU work on hetsched's memory)."""

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.addr: dict[str, int] = {}
        self.shape: tuple[int, ...] = (0,)

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shape = tuple(shape)
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shape

    def set_tensor_address(self, name: str, ptr: int) -> None:
        self.addr[name] = int(ptr)

    def _arr(self, ptr: int) -> Any:
        cp = self.cp
        n = int(np.prod(self.shape))
        mem = cp.cuda.UnownedMemory(ptr, n * 4, None, 0)
        return cp.ndarray((n,), cp.float32, cp.cuda.MemoryPointer(mem, 0))

    def execute_async_v3(self, *, stream_handle: Any) -> bool:
        cp = self.cp
        with cp.cuda.ExternalStream(int(stream_handle)):
            cp.multiply(self._arr(self.addr["x"]), 2, out=self._arr(self.addr["y"]))
        return True


@step
def worker_context(rt: Any, integrated: bool) -> None:
    cp = _cupy()
    if cp is None:
        report("worker_context", None, skip="cupy is not importable")
        return
    from hetsched._memory.cuda import HOST_MAPPINGS
    from hetsched.backends._tensorrt_run import WorkerContext
    from hetsched.lowlevel import BufferPool

    shape = (64, 1024, 256)  # 64 MiB of float32
    f32 = np.dtype(np.float32)
    engine = types.SimpleNamespace(create_execution_context=lambda: _CupyContext(cp), get_tensor_shape=lambda n: shape)
    handle = types.SimpleNamespace(engine=engine, inputs=("x",), outputs=("y",), dtypes={"x": f32, "y": f32})
    before = len(WARNINGS)
    with tempfile.TemporaryDirectory() as tmp, BufferPool("host", root=tmp) as pool:
        x, y = pool.acquire_nowait((np.float32, shape)), pool.acquire_nowait((np.float32, shape))
        x.array()[:] = np.random.default_rng(3).standard_normal(shape, dtype=np.float32)
        ctx = WorkerContext(rt, handle, 0, integrated=integrated)
        t0 = time.perf_counter()
        ctx.run({"x": x.array()}, [y.array()])  # pool buffers: pinned copies or bound in place
        t1 = time.perf_counter()
        bound = dict(ctx.context.addr)  # where the pool run's x and y were bound
        x_ptr, y_ptr = x.ptr, y.ptr
        pool_ok = bool(np.array_equal(y.array(), 2 * x.array()))
        own = np.random.default_rng(4).standard_normal(shape, dtype=np.float32)  # not a pool's: staged
        t2 = time.perf_counter()
        (z,) = ctx.run({"x": own})
        t3 = time.perf_counter()
        staged_ok = bool(np.array_equal(z, 2 * own))
        counts = (ctx.bound, ctx.pinned, ctx.staged)
        ctx.close()
        x.release()
        y.release()
        registered_open = HOST_MAPPINGS.registered()
    registered = HOST_MAPPINGS.registered()
    expect = (2, 0, 2) if integrated else (0, 2, 2)
    report("worker_context", pool_ok and staged_ok and counts == expect and registered == 0, integrated=integrated,
           pool_buffers_exact=pool_ok, staged_exact=staged_ok, bound_pinned_staged=counts, expected=expect,
           pool_run_ms=round((t1 - t0) * 1e3, 1), staged_run_ms=round((t3 - t2) * 1e3, 1),
           pool_run_bound_at_host_addresses=(bound.get("x") == x_ptr, bound.get("y") == y_ptr),
           registered_while_open=registered_open, registered_after_close=registered,
           warnings=WARNINGS[before:])


@step
def backends_say_why() -> None:
    from hetsched.backends.tensorrt import tensorrt_unavailable_reason
    try:
        import onnxruntime as ort
        eps = ort.get_available_providers()
    except Exception as exc:
        eps = [f"onnxruntime missing: {exc}"]
    report("backends_say_why", True, tensorrt=tensorrt_unavailable_reason(), onnxruntime_providers=eps)


def main() -> int:
    versions()
    backends_say_why()
    loaded = load()
    if loaded is None:
        print("SKIP: no CUDA here (cuda-python or a CUDA device missing); the GPU steps did not run", flush=True)
        save()
        return 3
    rt, _ = loaded
    gpu_info_step(rt)
    error_translation(rt)
    for backing in ("memfd", "anonymous"):
        host_registration(rt, backing)
    engine_round_trips(rt)
    baselines(rt)
    preemption(rt)
    worker_context(rt, False)
    worker_context(rt, True)
    save()
    failed = [r["step"] for r in RESULTS if r["ok"] is False]
    print(f"probe: {len(RESULTS)} steps, failed: {failed or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
