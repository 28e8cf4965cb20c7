"""Public test helpers: fake SoC sysfs trees and fake backends, so users can test too.

* :func:`build_board_tree` -- a consistent snapshot of an RK3588 / Orin sysfs tree under a
  temporary root (JP5/JP6 naming variants for Orin, vendor/mainline zone names for RK3588);
* :class:`FakeBackend`, :func:`fake_device` -- a backend that runs stages with onnx's
  pure-numpy reference evaluator (or your handler) and records what ran where;
* :func:`dvfs_knobs` -- every clock knob under a root as bytes, to check a restore;
* :func:`with_seeded_weights` -- a model whose ``ConstantOfShape`` weights (the onnx wheel's light
  models) are seeded random initializers, for accuracy checks on fp16/int8 accelerators;
* :class:`VirtualClock` -- a clock that moves only when the test advances it
  (``Session(clock=VirtualClock())``), so what depends on elapsed time is decided by the test;
* :class:`TableBoard`, :func:`coupled_phase` -- phases whose time and power are functions of the
  clocks, with their exhaustive optimum, to score the governor's auto-tune against.
"""

from hetsched._runtime._clock import VirtualClock

from ._boards import BOARD_SOCS, build_board_tree
from ._fakes import FakeBackend, FakeCall, FakeStage, fake_device
from ._knobs import DVFS_KNOB_GLOBS, dvfs_knobs
from ._models import with_seeded_weights
from ._table_board import Optimum, TableBoard, coupled_phase, loop_measure, tune_on

__all__ = [
    "BOARD_SOCS",
    "DVFS_KNOB_GLOBS",
    "FakeBackend",
    "FakeCall",
    "FakeStage",
    "Optimum",
    "TableBoard",
    "VirtualClock",
    "build_board_tree",
    "coupled_phase",
    "dvfs_knobs",
    "fake_device",
    "loop_measure",
    "tune_on",
    "with_seeded_weights",
]
