"""The RKNN toolkit's worker: a script run by the toolkit environment's own Python.

It must not import hetsched (hetsched is not installed there): the standard library, numpy and
``rknn.api`` only. ``client.ToolkitProcess`` starts it by file path as
``python -I _worker_main.py SOCKET_FD PARENT_PID [LOG]``.

Protocol over the inherited ``AF_UNIX`` stream socket: each message is a 4-byte big-endian
length and that many bytes of UTF-8 JSON. Messages never carry array data: arrays lie in
shared memory (memfds) whose descriptors the client sends once each, with ``SCM_RIGHTS`` and
a ``{"cmd": "fd", "id": N}`` message, and then names by ``id`` and byte offset.

Commands (every one but ``fd`` and ``forget`` gets exactly one reply, ``{"ok": bool, ...}``):
``hello`` (toolkit version), ``build`` (a model into the simulator -> a handle, or the toolkit's
own error text), ``run`` (a handle, input and output references), ``release`` (a handle),
``fd`` / ``forget`` (descriptors), ``bye`` (exit). End of file on the socket also exits.

The toolkit prints a great deal, from Python and from C. File descriptors 1 and 2 are pointed
at a memfd before ``rknn`` is imported, so nothing reaches the protocol socket or the parent's
terminal; after a failed call its error lines are read back from there as the message. With a
LOG path, everything captured is also appended to that file.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import socket
import struct
import sys
import threading
import time
from typing import Any

_LEN = struct.Struct(">I")


def _die_with_parent(parent: int, lifeline: int) -> None:
    # The parent holds the only write end of the lifeline pipe: the read returns (EOF) when the
    # parent closes this worker or dies in any way, even while the main thread is inside a
    # long toolkit call that would not notice the socket closing.
    if os.getppid() != parent:  # the parent died before this process got here
        os._exit(1)

    def watch() -> None:
        while True:
            try:
                if not os.read(lifeline, 1):
                    os._exit(1)
            except InterruptedError:
                continue
            except OSError:
                os._exit(1)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


class _Capture:
    """fds 1 and 2 go into a memfd; ``take()`` returns what was written since the last take."""

    def __init__(self, log: str | None) -> None:
        self.fd = os.memfd_create("rknn-worker-output")
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.fd, 1)
        os.dup2(self.fd, 2)
        self.log = log
        self._libc = ctypes.CDLL(None)

    def take(self) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        self._libc.fflush(None)  # the toolkit's C code writes through stdio buffers
        size = os.fstat(self.fd).st_size
        data = os.pread(self.fd, size, 0) if size else b""
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        if data and self.log:
            with open(self.log, "ab") as f:
                f.write(data)
        return data.decode("utf-8", "replace")


def _error_lines(text: str) -> str:
    """The toolkit's error lines (``E <where>: <what>``) of captured output, without colour codes."""
    out = []
    for raw in text.splitlines():
        line = raw
        while "\x1b[" in line:  # strip ANSI colour sequences
            i = line.index("\x1b[")
            j = line.find("m", i)
            line = line[:i] + (line[j + 1 :] if j >= 0 else "")
        line = line.strip()
        # on an error the toolkit repeats its version line at error level: not part of the message
        if line.startswith("E ") and "Traceback" not in line and "rknn-toolkit2 version" not in line:
            out.append(line[2:].strip())
    return "\n".join(out[-5:])


class _Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.fds: list[int] = []

    def _fill(self) -> bool:
        data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 16)
        self.fds.extend(fds)
        if not data:
            return False
        self.buf += data
        return True

    def recv(self) -> dict[str, Any] | None:
        while len(self.buf) < 4:
            if not self._fill():
                return None
        (n,) = _LEN.unpack_from(self.buf)
        while len(self.buf) < 4 + n:
            if not self._fill():
                return None
        msg: dict[str, Any] = json.loads(bytes(self.buf[4 : 4 + n]))
        del self.buf[: 4 + n]
        return msg

    def send(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg).encode()
        self.sock.sendall(_LEN.pack(len(data)) + data)


class _Worker:
    def __init__(self, capture: _Capture) -> None:
        self.capture = capture
        self.maps: dict[int, mmap.mmap] = {}
        self.models: dict[int, Any] = {}
        self.next_handle = 1
        self.RKNN: Any = None
        self.version = ""
        self.import_error = ""

    def load_toolkit(self) -> None:
        try:
            from rknn.api import RKNN  # type: ignore[import-not-found]  # only in the toolkit's env

            self.RKNN = RKNN
            try:
                from importlib.metadata import version

                self.version = version("rknn-toolkit2")
            except Exception:
                self.version = "unknown"
        except BaseException as exc:  # a broken environment must be reported, not crash silently
            self.import_error = f"cannot import rknn.api: {type(exc).__name__}: {exc}"
        self.capture.take()

    # -- commands --------------------------------------------------------------

    def hello(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.import_error:
            return {"ok": False, "message": self.import_error}
        return {"ok": True, "version": self.version, "pid": os.getpid()}

    def _failure(self, what: str, exc: BaseException | None) -> str:
        lines = _error_lines(self.capture.take())
        if lines:
            return lines
        if exc is not None:
            return f"{what}: {type(exc).__name__}: {exc}"
        return f"{what} failed"

    def build(self, msg: dict[str, Any]) -> dict[str, Any]:
        req = msg["req"]
        t0 = time.perf_counter()
        self.capture.take()
        r = self.RKNN(verbose=False)
        step = "config"
        try:
            kw: dict[str, Any] = {"target_platform": req["target"], "float_dtype": req["float_dtype"]}
            for opt in ("quantized_dtype", "quantized_algorithm"):
                if req.get(opt):
                    kw[opt] = req[opt]
            if r.config(**kw) not in (0, None):
                raise _Refused
            step = "load_onnx"
            if r.load_onnx(model=req["onnx_path"]) != 0:
                raise _Refused
            step = "build"
            if r.build(do_quantization=bool(req["quantize"]), dataset=req.get("dataset")) != 0:
                raise _Refused
            if req.get("export_path"):
                step = "export_rknn"
                if r.export_rknn(req["export_path"]) != 0:
                    raise _Refused
            step = "init_runtime"
            if r.init_runtime() != 0:
                raise _Refused
        except BaseException as exc:
            message = self._failure(step, None if isinstance(exc, _Refused) else exc)
            with contextlib.suppress(Exception):
                r.release()
            self.capture.take()
            return {"ok": False, "message": message, "seconds": time.perf_counter() - t0}
        self.capture.take()
        handle = self.next_handle
        self.next_handle += 1
        self.models[handle] = r
        return {"ok": True, "handle": handle, "seconds": time.perf_counter() - t0}

    def _view(self, ref: dict[str, Any]) -> Any:
        import numpy as np

        mm = self.maps[ref["fd"]]
        dtype = np.dtype(ref["dtype"])
        shape = tuple(ref["shape"])
        count = 1
        for d in shape:
            count *= d
        return np.frombuffer(mm, dtype=dtype, count=count, offset=ref["offset"]).reshape(shape)

    def run(self, msg: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        r = self.models.get(msg["handle"])
        if r is None:
            return {"ok": False, "message": f"no model with handle {msg['handle']}"}
        try:
            inputs = [self._view(ref) for ref in msg["inputs"]]
            outputs = [self._view(ref) for ref in msg["outputs"]]
        except (KeyError, ValueError) as exc:
            return {"ok": False, "message": f"bad buffer reference: {type(exc).__name__}: {exc}"}
        try:
            formats = ["nchw" if a.ndim == 4 else None for a in inputs]
            results = r.inference(inputs=inputs, data_format=formats if len(inputs) > 1 else formats[0])
            if results is None or len(results) != len(outputs):
                raise _Refused
            for out, res in zip(outputs, results, strict=True):
                res = np.asarray(res)
                if res.size != out.size:
                    raise ValueError(f"output of shape {res.shape} does not fit {out.shape}")
                out[...] = res.reshape(out.shape)
        except BaseException as exc:
            return {"ok": False, "message": self._failure("inference", None if isinstance(exc, _Refused) else exc)}
        self.capture.take()
        return {"ok": True}

    def release(self, msg: dict[str, Any]) -> dict[str, Any]:
        r = self.models.pop(msg["handle"], None)
        if r is not None:
            with contextlib.suppress(Exception):
                r.release()
        self.capture.take()
        return {"ok": True}

    def add_fd(self, ident: int, fd: int) -> None:
        old = self.maps.pop(ident, None)
        if old is not None:
            old.close()
        try:
            self.maps[ident] = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)  # the mapping keeps the memory alive; the descriptor is not needed

    def forget(self, ids: list[int]) -> None:
        for ident in ids:
            mm = self.maps.pop(ident, None)
            if mm is not None:
                with contextlib.suppress(BufferError):  # a view of it is still alive; it goes with that view
                    mm.close()


class _Refused(Exception):
    """A toolkit call returned a failure code instead of raising."""


def main(argv: list[str]) -> int:
    sock_fd, parent = int(argv[1]), int(argv[2])
    log = argv[3] if len(argv) > 3 and argv[3] else None
    _die_with_parent(parent, int(argv[4]))
    capture = _Capture(log)
    channel = _Channel(socket.socket(fileno=sock_fd))
    worker = _Worker(capture)
    worker.load_toolkit()
    handlers = {"hello": worker.hello, "build": worker.build, "run": worker.run, "release": worker.release}
    while True:
        msg = channel.recv()
        if msg is None:
            return 0
        cmd = str(msg.get("cmd"))
        if cmd == "fd":
            if not channel.fds:
                channel.send({"ok": False, "message": "fd message without a descriptor"})
                return 1
            worker.add_fd(int(msg["id"]), channel.fds.pop(0))
            continue
        if cmd == "forget":
            worker.forget([int(i) for i in msg["ids"]])
            continue
        if cmd == "bye":
            channel.send({"ok": True})
            return 0
        handler = handlers.get(cmd)
        if handler is None:
            channel.send({"ok": False, "message": f"unknown command {cmd!r}"})
            continue
        channel.send(handler(msg))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
