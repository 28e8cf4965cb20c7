"""``ToolkitProcess``: the RKNN toolkit running in its own environment, as a worker process.

rknn-toolkit2 pins numpy, onnx, protobuf and torch to versions that cannot share an
environment with hetsched, so it runs in a process started with the toolkit environment's
Python (``env.find_toolkit_python``), executing ``_worker_main.py`` by path. The two talk over
a socket pair with small length-prefixed JSON messages (protocol in ``_worker_main``'s
docstring); arrays never go through the socket: inputs and outputs that lie in a pool's memfd
slab are named by (descriptor, offset) (the descriptor is sent once with ``SCM_RIGHTS``);
others are copied once through this process's own memfd arena, which grows as needed.

One call at a time per process (a lock); several processes may run in parallel. A process
that dies or breaks the protocol makes the call raise :class:`ToolkitWorkerError` naming the
process, and every later call raise it at once. The child dies with the parent: it blocks a
thread on a "lifeline" pipe whose only write end this process holds, and exits when that read
returns (this process closed the worker or died, however it died).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from .._errors import ToolkitWorkerError
from .._memory.shared import locate_shared

__all__ = ["BuildRequest", "BuildResult", "ToolkitProcess", "ToolkitProcessStatistics"]

_WORKER = Path(__file__).with_name("_worker_main.py")
_LEN = struct.Struct(">I")
_ALIGN = 64
_MAX_REMOTE_FDS = 64
"""Descriptors the child may hold before the ones of unmapped slabs are forgotten."""


@dataclass(frozen=True)
class BuildRequest:
    """What to build: a prepared stage model (static shapes, opset >= 13) for one target."""

    onnx_path: str
    target: str = "rk3588"
    float_dtype: str = "float16"
    quantize: bool = False
    dataset: str | None = None
    """The toolkit's dataset file: a text file listing ``.npy`` paths (quantization)."""
    quantized_dtype: str | None = None
    """``RKNN.config(quantized_dtype=...)`` (the toolkit's default, ``"w8a8"``, when None)."""
    quantized_algorithm: str | None = None
    """``RKNN.config(quantized_algorithm=...)`` (``"normal"`` when None)."""
    export_path: str | None = None
    """Where to write the ``.rknn`` (the compile cache), or nowhere."""


@dataclass(frozen=True)
class BuildResult:
    ok: bool
    message: str
    """The toolkit's own error text when not ok (``""`` when ok)."""
    seconds: float
    toolkit_version: str


@dataclass(frozen=True)
class ToolkitProcessStatistics:
    name: str
    pid: int | None
    alive: bool
    builds: int
    build_failures: int
    runs: int
    by_reference: int
    """Arrays passed as (descriptor, offset) of a pool slab: no copy."""
    arena_copies: int
    """Arrays copied through the process's own arena (inputs in, outputs out)."""
    arena_bytes: int
    """Current size of the arena."""
    descriptors_sent: int


# -- lifetime ----------------------------------------------------------------------
# The child must not outlive this process. PR_SET_PDEATHSIG is tied to the *thread* that forked
# the child (a short-lived anyio worker thread would kill it early), so the child instead holds
# the read end of a "lifeline" pipe whose only write end stays here: when this process dies,
# however it dies, the kernel closes the write end and the child's blocked read returns.


class _Arena:
    """A memfd this process copies arrays through; replaced by a bigger one when too small."""

    def __init__(self) -> None:
        self.fd = -1
        self.mm: mmap.mmap | None = None
        self.size = 0
        self.buf: np.ndarray[Any, np.dtype[np.uint8]] | None = None

    def ensure(self, nbytes: int) -> bool:
        """Make room for ``nbytes``; True when the arena was replaced (its fd must be sent)."""
        if nbytes <= self.size:
            return False
        size = max(mmap.PAGESIZE, 1 << (nbytes - 1).bit_length())
        fd = os.memfd_create("hetsched:rknn-arena", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.close()
        self.fd, self.mm, self.size = fd, mm, size
        self.buf = np.frombuffer(mm, dtype=np.uint8)
        return True

    def close(self) -> None:
        self.buf = None
        if self.mm is not None:
            with contextlib.suppress(BufferError):
                self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.size = 0


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class ToolkitProcess:
    """One RKNN toolkit worker process (module docstring).

    :param name: what the process serves (the device), for messages.
    :param python: the toolkit environment's interpreter; default ``env.find_toolkit_python()``.
    :param log: a file the toolkit's own output is appended to (default: discarded).
    """

    def __init__(self, *, name: str, python: str | None = None, log: str | os.PathLike[str] | None = None) -> None:
        self.name = name
        self._python = python
        self._log = os.path.abspath(log) if log is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lifeline = -1
        self._scratch: str | None = None  # the worker's cwd: what the toolkit dumps there goes with it
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._dead: str | None = None
        self._closed = False
        self._rbuf = bytearray()
        self._arena = _Arena()
        self._remote: dict[tuple[int, int], int] = {}  # (fd, inode) -> id in the child
        self._next_id = 1
        self.toolkit_version = ""
        self._builds = self._build_failures = self._runs = 0
        self._by_reference = self._arena_copies = self._descriptors_sent = 0

    # -- life cycle ----------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._dead is None and not self._closed and self._proc.poll() is None

    def start(self) -> None:
        """Spawn the worker and wait until the toolkit is imported.

        :raises BackendUnavailableError: no toolkit environment (see ``env.find_toolkit_python``).
        :raises ToolkitWorkerError: the worker could not start or could not import the toolkit.
        :raises RuntimeStateError: already started.
        """
        from .._errors import RuntimeStateError
        from .env import find_toolkit_python

        if self._proc is not None or self._closed:
            raise RuntimeStateError(f"{self.name}: toolkit process already started")
        python = self._python or find_toolkit_python()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        life_r, life_w = os.pipe()  # both non-inheritable: no other child gets the write end
        argv = [python, "-I", str(_WORKER), str(child.fileno()), str(os.getpid()), self._log or "", str(life_r)]
        # a private scratch directory as the worker's cwd (the toolkit writes .npy dumps and logs
        # there, never into the caller's folder), removed with the process in close()
        self._scratch = tempfile.mkdtemp(prefix="hetsched-rknn-")
        try:
            self._proc = subprocess.Popen(
                argv, pass_fds=(child.fileno(), life_r), stdin=subprocess.DEVNULL, cwd=self._scratch,
                # stderr: a pipe until the worker points fd 2 elsewhere, so that a worker that
                # dies before that (a broken environment) can be diagnosed from its last lines
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_fds=True,
            )
        except OSError as exc:
            parent.close()
            os.close(life_w)
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
            raise ToolkitWorkerError(f"{self.name}: cannot start the toolkit worker {python}: {exc}") from exc
        finally:
            child.close()
            os.close(life_r)
        self._lifeline = life_w
        self._sock = parent
        try:
            reply = self._call({"cmd": "hello"}, "starting")
        except ToolkitWorkerError as exc:
            said = self._early_stderr()
            self.close()
            if said:
                raise ToolkitWorkerError(f"{exc}; it said:\n{said}") from None
            raise
        finally:
            if self._proc.stderr is not None and self._proc.poll() is None:
                self._proc.stderr.close()
        if not reply.get("ok"):
            message = reply.get("message", "")
            self.close()
            raise ToolkitWorkerError(f"{self.name}: toolkit worker ({python}) cannot start: {message}")
        self.toolkit_version = str(reply.get("version", ""))

    def _early_stderr(self) -> str:
        """The last lines a worker that died at start wrote to stderr (it is reaped by now)."""
        pipe = self._proc.stderr if self._proc is not None else None
        if pipe is None or self._proc is None or self._proc.poll() is None:
            return ""
        os.set_blocking(pipe.fileno(), False)
        try:
            data = pipe.read(1 << 16) or b""
        except OSError:
            data = b""
        return "\n".join(data.decode("utf-8", "replace").strip().splitlines()[-5:])

    def close(self) -> None:
        """Stop the worker and reap it (no orphan, no zombie). Idempotent; safe from any thread."""
        self._closed = True
        proc, sock = self._proc, self._sock
        if proc is not None and proc.poll() is None:
            if sock is not None and self._lock.acquire(blocking=False):
                try:
                    self._send({"cmd": "bye"})
                except OSError:
                    pass
                finally:
                    self._lock.release()
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._lifeline >= 0:
            os.close(self._lifeline)  # the child's lifeline read returns: it exits if still running
            self._lifeline = -1
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a call blocked in recv in another thread
        if self._lock.acquire(timeout=5.0):
            try:
                if proc is not None and proc.stderr is not None:
                    proc.stderr.close()
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
                self._arena.close()
            finally:
                self._lock.release()
        scratch, self._scratch = self._scratch, None
        if scratch is not None and (proc is None or proc.poll() is not None):
            shutil.rmtree(scratch, ignore_errors=True)  # the worker is reaped: nothing writes there now

    def __enter__(self) -> ToolkitProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def statistics(self) -> ToolkitProcessStatistics:
        return ToolkitProcessStatistics(
            name=self.name, pid=self.pid, alive=self.alive, builds=self._builds,
            build_failures=self._build_failures, runs=self._runs, by_reference=self._by_reference,
            arena_copies=self._arena_copies, arena_bytes=self._arena.size,
            descriptors_sent=self._descriptors_sent,
        )

    # -- commands ----------------------------------------------------------------

    def build(self, req: BuildRequest) -> tuple[int | None, BuildResult]:
        """Build ``req`` in the simulator; the built model stays loaded for :meth:`run`.

        A model the toolkit refuses is not an error here: the result has ``ok=False`` and the
        toolkit's own message, and the handle is None.

        :raises ToolkitWorkerError: the worker died or broke the protocol.
        """
        with self._lock:
            wire = asdict(req)
            for k in ("onnx_path", "dataset", "export_path"):  # the worker's cwd is its scratch directory
                if wire[k]:
                    wire[k] = os.path.abspath(wire[k])
            reply = self._call_locked({"cmd": "build", "req": wire}, f"building {req.onnx_path}")
        self._builds += 1
        ok = bool(reply.get("ok"))
        if not ok:
            self._build_failures += 1
        result = BuildResult(
            ok=ok, message="" if ok else str(reply.get("message", "")),
            seconds=float(reply.get("seconds", 0.0)), toolkit_version=self.toolkit_version,
        )
        return (int(reply["handle"]) if ok else None), result

    def run(self, handle: int, inputs: Sequence[np.ndarray[Any, Any]], outputs: Sequence[np.ndarray[Any, Any]]) -> None:
        """Run a built model; the results are written into ``outputs`` in place.

        :param inputs: in the model's input order (NCHW for 4-d inputs).
        :param outputs: preallocated, in the model's output order.
        :raises ToolkitWorkerError: the worker died, broke the protocol, or the toolkit failed to
            run (the message says which).
        """
        with self._lock:
            self._check_locked("running")
            refs_in, refs_out, copy_back = self._refs_locked(inputs, outputs)
            reply = self._call_locked(
                {"cmd": "run", "handle": handle, "inputs": refs_in, "outputs": refs_out}, f"running model {handle}"
            )
            if not reply.get("ok"):
                raise ToolkitWorkerError(f"{self.name}: the toolkit failed to run model {handle}: {reply.get('message')}")
            arena = self._arena.buf
            for out, offset in copy_back:
                assert arena is not None
                src = arena[offset : offset + out.nbytes].view(out.dtype).reshape(out.shape)
                np.copyto(out, src)
            self._runs += 1

    def release(self, handle: int) -> None:
        """Drop a built model from the simulator.

        :raises ToolkitWorkerError: the worker died or broke the protocol.
        """
        self._call({"cmd": "release", "handle": handle}, f"releasing model {handle}")

    # -- buffers ---------------------------------------------------------------------

    def _remote_id_locked(self, fd: int) -> int:
        key = (fd, os.fstat(fd).st_ino)  # fd numbers are reused once a slab is unmapped
        ident = self._remote.get(key)
        if ident is None:
            if len(self._remote) >= _MAX_REMOTE_FDS:
                self._forget_locked()
            ident = self._next_id
            self._next_id += 1
            data = json.dumps({"cmd": "fd", "id": ident}).encode()
            self._io(lambda s: socket.send_fds(s, [_LEN.pack(len(data)) + data], [fd]), "sending a descriptor")
            self._remote[key] = ident
            self._descriptors_sent += 1
        return ident

    def _forget_locked(self) -> None:
        stale = list(self._remote.values())
        self._remote.clear()
        self._send_locked({"cmd": "forget", "ids": stale}, "forgetting descriptors")

    def _refs_locked(
        self, inputs: Sequence[np.ndarray[Any, Any]], outputs: Sequence[np.ndarray[Any, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[np.ndarray[Any, Any], int]]]:
        placed: list[tuple[np.ndarray[Any, Any], bool, tuple[int, int] | None]] = []
        need = 0
        for a, is_out in [(a, False) for a in inputs] + [(a, True) for a in outputs]:
            loc = None
            if a.flags.c_contiguous and (not is_out or a.flags.writeable):
                loc = locate_shared(a.ctypes.data, a.nbytes)
            if loc is None:
                need += (a.nbytes + _ALIGN - 1) & ~(_ALIGN - 1)
            placed.append((a, is_out, loc))
        if need:
            old_fd = self._arena.fd
            old_key = (old_fd, os.fstat(old_fd).st_ino) if old_fd >= 0 else None
            if self._arena.ensure(need) and old_key is not None:
                stale = self._remote.pop(old_key, None)  # the child drops its mapping of the old arena
                if stale is not None:
                    self._send_locked({"cmd": "forget", "ids": [stale]}, "forgetting the old arena")
        refs_in: list[dict[str, Any]] = []
        refs_out: list[dict[str, Any]] = []
        copy_back: list[tuple[np.ndarray[Any, Any], int]] = []
        offset = 0
        for a, is_out, loc in placed:
            if loc is not None:
                fd, at = loc
                ident = self._remote_id_locked(fd)
                self._by_reference += 1
            else:
                ident, at = self._remote_id_locked(self._arena.fd), offset
                offset += (a.nbytes + _ALIGN - 1) & ~(_ALIGN - 1)
                self._arena_copies += 1
                if is_out:
                    copy_back.append((a, at))
                else:
                    arena = self._arena.buf
                    assert arena is not None
                    np.copyto(arena[at : at + a.nbytes].view(a.dtype).reshape(a.shape), a)
            ref = {"fd": ident, "offset": at, "dtype": a.dtype.str, "shape": list(a.shape)}
            (refs_out if is_out else refs_in).append(ref)
        return refs_in, refs_out, copy_back

    # -- protocol -------------------------------------------------------------------

    def _call(self, msg: dict[str, Any], doing: str) -> dict[str, Any]:
        with self._lock:
            return self._call_locked(msg, doing)

    def _check_locked(self, doing: str) -> None:
        if self._dead is not None:
            raise ToolkitWorkerError(self._dead)
        if self._closed or self._sock is None:
            raise ToolkitWorkerError(f"{self.name}: toolkit worker is closed (while {doing})")

    def _call_locked(self, msg: dict[str, Any], doing: str) -> dict[str, Any]:
        self._check_locked(doing)
        self._send_locked(msg, doing)
        while len(self._rbuf) < 4:
            self._fill(doing)
        (n,) = _LEN.unpack_from(self._rbuf)
        while len(self._rbuf) < 4 + n:
            self._fill(doing)
        try:
            reply = json.loads(bytes(self._rbuf[4 : 4 + n]))
        except ValueError as exc:
            self._broken(doing, f"sent a malformed reply ({exc})")
        del self._rbuf[: 4 + n]
        if not isinstance(reply, dict):
            self._broken(doing, "sent a reply that is not an object")
        checked: dict[str, Any] = reply
        return checked

    def _send_locked(self, msg: dict[str, Any], doing: str) -> None:
        self._check_locked(doing)
        data = json.dumps(msg).encode()
        self._io(lambda s: s.sendall(_LEN.pack(len(data)) + data), doing)

    def _send(self, msg: dict[str, Any]) -> None:
        if self._sock is not None and self._dead is None:
            data = json.dumps(msg).encode()
            self._sock.sendall(_LEN.pack(len(data)) + data)

    def _io(self, fn: Callable[[socket.socket], object], doing: str) -> None:
        sock = self._sock
        if sock is None:
            raise ToolkitWorkerError(f"{self.name}: toolkit worker is closed (while {doing})")
        try:
            fn(sock)
        except OSError as exc:
            self._broken(doing, f"lost its socket ({exc.strerror or exc})")

    def _fill(self, doing: str) -> None:
        sock = self._sock
        if sock is None:
            raise ToolkitWorkerError(f"{self.name}: toolkit worker is closed (while {doing})")
        try:
            data = sock.recv(1 << 16)
        except OSError as exc:
            self._broken(doing, f"lost its socket ({exc.strerror or exc})")
        if not data:
            self._broken(doing, "died")
        self._rbuf += data

    def _broken(self, doing: str, what: str) -> Any:
        """Record that the worker is unusable, reap it, and raise ToolkitWorkerError."""
        proc = self._proc
        status = ""
        if proc is not None:
            if what != "died":
                proc.kill()
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            status = f" ({_describe_exit(proc.returncode)})"
        pid = proc.pid if proc is not None else None
        closed = " after close()" if self._closed else ""
        self._dead = f"{self.name}: toolkit worker pid {pid} {what}{status}{closed} while {doing}"
        raise ToolkitWorkerError(self._dead)

