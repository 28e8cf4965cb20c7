"""Rail power estimated from the twin's model, for boards without power sensors (RK3588).

``power_estimator(soc)`` returns a pure function ``Snapshot -> {rail: watts}`` that
:class:`hetsched.Telemetry` calls with the sampled clocks, utilisations and
temperatures; the rails it returns are marked ``estimated``. The same energy model as
the twin's physics: per domain ``units * C * V(f)^2 * f * (util + idle_activity)``
plus leakage rising with temperature; the board rail adds the static power and the
regulator loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from hetsched._snapshot import Snapshot

from .physics import dynamic_power_w, leakage_w
from .profiles import SocProfile, get_profile

__all__ = ["power_estimator"]


def power_estimator(soc: str | SocProfile) -> Callable[[Snapshot], Mapping[str, float]]:
    """An estimator for ``soc``'s rails that the board does not measure.

    :raises UnknownSocError: no such profile.
    """
    profile = get_profile(soc) if isinstance(soc, str) else soc
    estimated = [r for r in profile.rails if not r.measured]

    def estimate(snap: Snapshot) -> Mapping[str, float]:
        temps = [z.temp_c for z in snap.zones.values() if z.temp_c is not None]
        temp = max(temps) if temps else 25.0
        power: dict[str, float] = {}
        for d in profile.domains:
            st = snap.domains.get(d.name)
            f = (st.freq_hz if st is not None and st.freq_hz else None) or d.boot_hz or d.min_hz
            util = st.utilisation if st is not None else None
            if util is None and d.cpus and snap.cpu_utilisation:
                vals = [snap.cpu_utilisation[c] for c in d.cpus if c < len(snap.cpu_utilisation)]
                util = sum(vals) / len(vals) if vals else None
            util = min(1.0, max(0.0, util or 0.0))
            v = d.voltage_at(f)
            if d.gates_when_idle and util == 0.0:
                power[d.name] = 0.0
                continue
            power[d.name] = dynamic_power_w(d.capacitance, v, f, d.units, util, d.idle_activity) + leakage_w(
                d.leak_w, v, d.opps[-1].voltage_mv, temp, d.leak_per_c
            )
        out: dict[str, float] = {}
        for rail in estimated:
            if rail.total:
                out[rail.name] = (sum(power.values()) + profile.board_static_w) / profile.converter_efficiency
            else:
                out[rail.name] = rail.static_w + sum(power.get(k, 0.0) * s for k, s in rail.shares.items())
        return out

    return estimate
