"""Public test helpers: fake SoC sysfs trees and fake backends, so users can test too.

* :func:`build_board_tree` -- a consistent snapshot of an RK3588 / Orin sysfs tree under a
  temporary root (JP5/JP6 naming variants for Orin, vendor/mainline zone names for RK3588);
* :class:`FakeBackend`, :func:`fake_device` -- a backend that runs stages with onnx's
  pure-numpy reference evaluator (or your handler) and records what ran where;
* :func:`dvfs_knobs` -- every clock knob under a root as bytes, to check a restore;
* :func:`with_seeded_weights` -- a model whose ``ConstantOfShape`` weights (the onnx wheel's light
  models) are seeded random initializers, for accuracy checks on fp16/int8 accelerators;
* :class:`VirtualClock` -- a clock that moves only when the test advances it
  (``Session(clock=VirtualClock())``), so what depends on elapsed time is decided by the test.
"""

from hetsched._runtime._clock import VirtualClock

from ._boards import BOARD_SOCS, build_board_tree
from ._fakes import FakeBackend, FakeCall, FakeStage, fake_device
from ._knobs import DVFS_KNOB_GLOBS, dvfs_knobs
from ._models import with_seeded_weights

__all__ = [
    "BOARD_SOCS",
    "DVFS_KNOB_GLOBS",
    "FakeBackend",
    "FakeCall",
    "FakeStage",
    "VirtualClock",
    "build_board_tree",
    "dvfs_knobs",
    "fake_device",
    "with_seeded_weights",
]
