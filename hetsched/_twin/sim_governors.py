"""Kernel governor emulation of the fast simulation: which clock each domain runs at.

Kernel governors re-pick a domain's clock from the utilisation measured over their sampling
period (:func:`~hetsched._twin.kernel.governor_target`); ``userspace`` runs the requested
clock. The pick stays within [min, effective max] (thermal caps included); a new clock takes
effect after the domain's switch latency, a newer request superseding a pending one.
"""

from __future__ import annotations

from .kernel import governor_target, pick_opp
from .sim_core import INF, SimCore

__all__ = ["SimGovernors"]


class SimGovernors(SimCore):
    """Governor sampling, OPP picks and DVFS transitions on top of :class:`SimCore`."""

    def _apply_target(self, i: int) -> None:
        """Recompute the achieved clock of domain i under its governor/limits/caps."""
        if self._gov[i] == "userspace":
            self._set_target(i, pick_opp(self._avail[i], self._setspeed[i] or self._target[i], self._min[i], self._eff_max(i)))
        else:
            self._kernel_governor(i, self._util[i])

    def _kernel_governor(self, i: int, util: float) -> None:
        gov = self._gov[i]
        if gov == "rknpu_ondemand" and util <= 0.0 and self._target[i] <= self._eff_max(i):
            return  # a powered-off RKNPU is not re-clocked (it idles at its last rate, 1 GHz at boot)
        lo = self._min[i]
        hi = self._eff_max(i)
        if lo > hi:
            lo = hi
        av = self._avail[i]
        floor = self._floor[i]
        if floor and gov == self._gov_boot[i]:
            # The firmware governor (Jetson BPMP for EMC) never goes below its floor.
            lo = max(lo, pick_opp(av, floor, lo, hi))
        ud = self._updown[i]
        if ud is not None and gov == "simple_ondemand":
            up, down = ud
            load = util * 100.0
            cur = self._target[i]
            if load > up:
                f = pick_opp(av, hi, lo, hi)
            elif load > up - down:
                f = pick_opp(av, cur, lo, hi)
            else:
                f = pick_opp(av, int(cur * load / (up - down / 2)), lo, hi)
        else:
            f = governor_target(gov, util, self._target[i], av, lo, hi, self._setspeed[i])
        self._set_target(i, f)

    def _set_target(self, i: int, hz: int) -> None:
        if hz == self._target[i]:
            return
        self._ver += 1
        self._target[i] = hz
        self._freq_changes += 1
        oi = self._avail[i].index(hz)
        lat = self._latency[i]
        if lat <= 0.0:
            self._flush()
            self._oi[i] = oi
            self._recompute_power(i)
            if self._work is not None:
                self._work_rates()
            return
        # The new clock takes effect after the switch latency; a newer request supersedes.
        self._pending = [p for p in self._pending if p[1] != i]
        self._pending.append((self.time_s + lat, i, oi))
        self._next_pending = min(p[0] for p in self._pending)

    def _do_pending(self) -> None:
        self._flush()
        now = self.time_s
        keep = []
        changed = False
        for p in self._pending:
            if p[0] <= now + 1e-12:
                i = p[1]
                self._oi[i] = p[2]
                self._ver += 1
                self._recompute_power(i)
                changed = True
            else:
                keep.append(p)
        self._pending = keep
        self._next_pending = min((p[0] for p in keep), default=INF)
        if changed and self._work is not None:
            self._work_rates()

    def _schedule_governor(self, i: int) -> None:
        """Kernel governors sample every period; userspace has no sampling (and costs nothing)."""
        self._ver += 1
        if self._gov[i] == "userspace":
            self._next_gov[i] = INF
        elif self._next_gov[i] == INF:
            self._flush()
            self._busy_mark[i] = self._busy[i]
            self._next_gov[i] = self.time_s + self._gov_period[i]
        self._next_gov_any = min(self._next_gov)

    def _do_governors(self) -> None:
        self._flush()
        now = self.time_s
        for i in range(len(self._names)):
            if self._next_gov[i] <= now + 1e-12:
                period = self._gov_period[i]
                util = (self._busy[i] - self._busy_mark[i]) / period
                self._kernel_governor(i, util)
                self._busy_mark[i] = self._busy[i]
                self._next_gov[i] += period
        self._next_gov_any = min(self._next_gov)
