"""Phase-aware DVFS governor (internal package; the public names are re-exported by hetsched).

Layout: ``_phase`` (Phase), ``_points`` (domains, operating points), ``_model``
(measurements, separable phase model, joint choice), ``_thermal`` (RC fit, power cap),
``_decide`` (config and the pure decision), ``_tuner_seam`` (the ``Tuner`` protocol),
``_tuner`` (coordinate-descent auto-tune; its constants in ``_tuner_config``, its
budget-filling strategy in ``_tuner_budget``),
``_profile`` (JSON profiles), ``_advisor`` (batch size), ``_engine`` (the sync loop),
``_ports`` / ``_sysfs`` (simulation and board ports), ``_governor`` (the public class).
``hetsched.train`` (outside this package) attaches it to PyTorch training loops.
"""

from ._advisor import BatchAdvice, BatchMeasurement, BatchOption, advise_batch_size
from ._decide import Decision, DecisionInput, GovernorConfig, Reason, decide
from ._engine import GovernorEngine, GovernorStatistics, PhaseStatistics
from ._governor import Governor, GovernorWarning
from ._model import Measurement, PhaseModel, choose
from ._phase import Phase
from ._points import DomainSpec, OperatingPoint, max_point, min_point
from ._ports import ClockPort, SimPort
from ._profile import BoardId, GovernorProfile
from ._thermal import RCFit, ThermalPrior, zone_power_cap
from ._tuner import AxisTuner, axis_tuner
from ._tuner_config import TunerConfig
from ._tuner_seam import Tuner, TunerFactory, TunerSettings, TunerStatistics

__all__ = [
    "AxisTuner",
    "BatchAdvice",
    "BatchMeasurement",
    "BatchOption",
    "BoardId",
    "ClockPort",
    "Decision",
    "DecisionInput",
    "DomainSpec",
    "Governor",
    "GovernorConfig",
    "GovernorEngine",
    "GovernorProfile",
    "GovernorStatistics",
    "GovernorWarning",
    "Measurement",
    "OperatingPoint",
    "Phase",
    "PhaseModel",
    "PhaseStatistics",
    "RCFit",
    "Reason",
    "SimPort",
    "ThermalPrior",
    "Tuner",
    "TunerConfig",
    "TunerFactory",
    "TunerSettings",
    "TunerStatistics",
    "advise_batch_size",
    "axis_tuner",
    "choose",
    "decide",
    "max_point",
    "min_point",
    "zone_power_cap",
]
