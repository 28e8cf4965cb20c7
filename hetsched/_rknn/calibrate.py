"""INT8 calibration data for NPU stages: the tensors each stage sees for the user's feeds.

A session's calibration feeds are feeds of the *model's* graph inputs; a stage in the middle
of the graph needs the tensors its upstream stages produce for them. :class:`CalibrationSet`
runs the whole fp32 model on the host with onnxruntime, once per feed, with every tensor a
stage asks for added as a graph output (computed once per tensor name and kept), and writes a
stage's samples as the toolkit's dataset: one ``.npy`` per stage input per sample (the
model's own layout, NCHW for images: the toolkit rejects NHWC files) and a text file with one
line per sample listing them. The dataset lives in the compile cache under
``calibration/<dd>/<digest>/`` (``digest``: sha256 over the input names and the arrays), so
the same data is written once and a change of data changes the stage's cache key.

On the command line (``--calibration DIR``) the feeds come from a directory of ``.npy`` files,
one per graph input per sample: ``<input>_<k>.npy`` (``k`` = 0, 1, ...), or ``<k>.npy`` for a
model with one graph input (:func:`load_calibration_dir`).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from hetsched._onnxruntime import ort_session

from .._errors import BackendError, ModelError, NotRegularFileError
from .._platform.files import open_contained_dir, read_regular_file, write_at

__all__ = ["CalibrationSet", "load_calibration_dir"]

_MAX_SAMPLES = 64
"""Samples written for the toolkit and used for the accuracy report (more add time, little else)."""


def _digest(names: Sequence[str], samples: Sequence[Sequence[np.ndarray]]) -> str:
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode() + b"\0")
    for sample in samples:
        for a in sample:
            arr = np.ascontiguousarray(a)
            h.update(f"{arr.dtype.str}{arr.shape}".encode())
            h.update(arr.tobytes())
    return h.hexdigest()


class CalibrationSet:
    """Calibration feeds of a model and the intermediate tensors computed from them.

    :param model: the whole model (fp32), as the session loaded it.
    :param feeds: feed dicts for the model's graph inputs (at most 64 are used).
    :raises ModelError: no feeds, or a feed misses a graph input.
    """

    def __init__(self, model: onnx.ModelProto, feeds: Iterable[Mapping[str, Any]]) -> None:
        inits = {t.name for t in model.graph.initializer}
        self.input_names = tuple(i.name for i in model.graph.input if i.name not in inits)
        self.feeds: list[dict[str, np.ndarray]] = []
        for k, feed in enumerate(feeds):
            if k >= _MAX_SAMPLES:
                break
            missing = [n for n in self.input_names if n not in feed]
            if missing:
                raise ModelError(f"calibration feed {k} has no value for the graph inputs {missing}")
            self.feeds.append({n: np.asarray(feed[n]) for n in self.input_names})
        if not self.feeds:
            raise ModelError("calibration needs at least one feed")
        self._model = model
        self._lock = threading.Lock()
        self._values: dict[str, list[np.ndarray]] = {n: [f[n] for f in self.feeds] for n in self.input_names}

    def __len__(self) -> int:
        return len(self.feeds)

    def tensors(self, names: Sequence[str]) -> list[list[np.ndarray]]:
        """Per sample, the values of ``names`` (graph inputs or intermediate tensors), in order.

        :raises ModelError: onnxruntime could not compute a tensor of that name.
        """
        with self._lock:
            missing = [n for n in dict.fromkeys(names) if n not in self._values]
            if missing:
                self._compute(missing)
            return [[self._values[n][k] for n in names] for k in range(len(self.feeds))]

    def _compute(self, names: list[str]) -> None:
        model = onnx.ModelProto()
        model.CopyFrom(self._model)
        known = {o.name for o in model.graph.output}
        for n in names:
            if n not in known:  # no type needed: onnxruntime infers it
                model.graph.output.append(onnx.ValueInfoProto(name=n))
        try:
            sess = ort_session(model.SerializeToString(), providers=["CPUExecutionProvider"])
            runs = [sess.run(names, feed) for feed in self.feeds]
        except Exception as exc:  # onnxruntime raises its own unrelated types
            raise ModelError(f"cannot compute the calibration tensors {names[:4]} with onnxruntime: {exc}") from exc
        for i, n in enumerate(names):
            self._values[n] = [np.asarray(r[i]) for r in runs]

    def write_dataset(self, directory: str | os.PathLike[str], names: Sequence[str]) -> tuple[Path, str]:
        """Write the samples of ``names`` (a stage's inputs) as a toolkit dataset under
        ``directory/calibration/`` and return (dataset file, digest). Files already there are
        compared byte for byte and written again where they differ; no link below ``directory``
        is followed.

        :raises ModelError: a tensor could not be computed.
        :raises BackendError: the directory cannot be written.
        """
        samples = [[np.ascontiguousarray(a, dtype=np.float32) if a.dtype.kind == "f" else a for a in s]
                   for s in self.tensors(names)]
        digest = _digest(names, samples)
        where = Path(directory) / "calibration" / digest[:2] / digest
        dataset = where / "dataset.txt"
        # the toolkit's process reads the files by these absolute names
        listed = Path(os.path.realpath(directory)) / "calibration" / digest[:2] / digest
        files: dict[str, bytes] = {}
        lines = []
        for k, sample in enumerate(samples):
            names_k = []
            for i, arr in enumerate(sample):
                buf = io.BytesIO()
                np.save(buf, arr, allow_pickle=False)
                files[f"{k}_{i}.npy"] = buf.getvalue()
                names_k.append(str(listed / f"{k}_{i}.npy"))
            lines.append(" ".join(names_k))
        text = ("\n".join(lines) + "\n").encode()
        try:
            # below the cache directory nothing is followed through a link (a linked folder is
            # replaced) and what is there is compared, not trusted: what differs is written again
            dfd = open_contained_dir(directory, ["calibration", digest[:2], digest])
            try:
                for name, data in [*files.items(), ("dataset.txt", text)]:  # the list last
                    if _read_at(dfd, name) != data:
                        write_at(dfd, name, data)
            finally:
                os.close(dfd)
        except OSError as exc:
            raise BackendError(f"cannot write the calibration dataset under {str(where)!r}: {exc}") from exc
        return dataset, digest
        try:
            where.mkdir(parents=True, exist_ok=True)
            lines = []
            for k, sample in enumerate(samples):
                paths = []
                for i, arr in enumerate(sample):
                    p = where / f"{k}_{i}.npy"
                    np.save(p, arr)
                    paths.append(str(p.resolve()))
                lines.append(" ".join(paths))
            tmp = where / ".dataset.txt.tmp"
            tmp.write_text("\n".join(lines) + "\n")
            os.replace(tmp, dataset)  # last: a dataset file always lists complete files
        except OSError as exc:
            raise BackendError(f"cannot write the calibration dataset under {str(where)!r}: {exc}") from exc
        return dataset, digest


_NAMED = re.compile(r"^(?P<name>.+)_(?P<k>\d+)\.npy$")
_NUMBERED = re.compile(r"^(?P<k>\d+)\.npy$")


def load_calibration_dir(directory: str | os.PathLike[str], input_names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """Feeds from a directory of ``.npy`` files: ``<input>_<k>.npy`` for each graph input and
    sample ``k``, or ``<k>.npy`` when the model has one graph input; samples in order of ``k``.

    :raises ModelError: the directory holds no sample, or a sample misses an input.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ModelError(f"calibration directory {str(root)!r} does not exist")
    by_k: dict[int, dict[str, Path]] = {}
    wanted = set(input_names)
    for p in sorted(root.iterdir()):
        m = _NAMED.match(p.name)
        if m and m["name"] in wanted:
            by_k.setdefault(int(m["k"]), {})[m["name"]] = p
        elif len(input_names) == 1 and (m := _NUMBERED.match(p.name)):
            by_k.setdefault(int(m["k"]), {})[input_names[0]] = p
    if not by_k:
        pattern = "<input>_<k>.npy" + (" or <k>.npy" if len(input_names) == 1 else "")
        raise ModelError(f"no calibration samples in {str(root)!r} (expected {pattern} for inputs "
                         f"{list(input_names)})")
    feeds = []
    for k in sorted(by_k):
        files = by_k[k]
        missing = [n for n in input_names if n not in files]
        if missing:
            raise ModelError(f"calibration sample {k} in {str(root)!r} has no file for the inputs {missing}")
        feeds.append({n: _load_npy(files[n]) for n in input_names})
    return feeds


def _read_at(dfd: int, name: str) -> bytes | None:
    """The bytes of the regular file ``name`` in ``dfd`` (not through a link), else None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return os.read(fd, st.st_size + 1) if st.st_size < (1 << 30) else None
    finally:
        os.close(fd)


def _load_npy(path: Path) -> np.ndarray:
    """One ``.npy`` array, read bounded and only from a regular file (a FIFO or a device is refused).

    :raises NotRegularFileError: ``path`` is not a regular file.
    :raises ModelError: it cannot be read or holds no ``.npy`` array.
    """
    try:
        data = read_regular_file(path, what="calibration file")
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except NotRegularFileError:
        raise
    except (OSError, ValueError, EOFError) as exc:
        raise ModelError(f"calibration file {str(path)!r} is not a readable .npy array: {exc}") from exc
    if not isinstance(array, np.ndarray):
        raise ModelError(f"calibration file {str(path)!r} holds no .npy array")
    return array
