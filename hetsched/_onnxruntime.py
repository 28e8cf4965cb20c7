"""onnxruntime's own ``InferenceSession``, reached where onnxruntime defines it.

Apps adopt hetsched by replacing ``onnxruntime.InferenceSession`` with
``hetsched.InferenceSession`` (``onnxruntime.InferenceSession = hetsched.InferenceSession`` is a
one-line switch). hetsched's own stages still need onnxruntime's class, so every place inside
hetsched that makes an onnxruntime session calls :func:`ort_session`, which takes the class
from ``onnxruntime.capi.onnxruntime_inference_collection`` (where onnxruntime defines it), never
the ``onnxruntime.InferenceSession`` attribute an app may have replaced. A leaf: it imports no
other hetsched module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["ort_session"]


def ort_session(*args: Any, **kwargs: Any) -> ort.InferenceSession:
    """``onnxruntime.InferenceSession(*args, **kwargs)`` with onnxruntime's own class."""
    from onnxruntime.capi.onnxruntime_inference_collection import InferenceSession

    return InferenceSession(*args, **kwargs)
