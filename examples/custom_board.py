"""Govern a board hetsched has no profile for: an older Jetson Nano (tegra210), described by you.

hetsched's governor talks to a board only through a :class:`hetsched.ClockPort`: list the
clock domains (:class:`hetsched.DomainSpec`), read the time and a telemetry snapshot, save and
restore every knob, write a frequency and read back what the domain runs at. This example
writes a small port of its own for the Nano's GPU and EMC (memory) clocks, over a fake
devfreq-style sysfs tree it builds in a temporary directory (it writes only there), runs an
inference loop under ``Governor(port=...)``, prints what the governor chose and checks that
every knob is back as it was after the ``with`` block.

On a real Nano, point ``NanoPort`` at ``/`` with the real directories, drop ``settle`` (the
kernel driver moves ``cur_freq`` itself) and read power from the board's INA3221 monitor.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar

from hetsched import ClockPort, DomainSpec, Governor, Phase, Snapshot

# Frequency steps of the Jetson Nano (tegra210, P3448), in Hz, as the kernel lists them in
# ``available_frequencies``:
# * GPU: 76.8 MHz to 921.6 MHz in 76.8 MHz steps -- NVIDIA Jetson Linux (L4T 32.x) Developer
#   Guide, "Power Management for Jetson Nano and Jetson TX1 Devices", and the GPU
#   operating-point table of the tegra210 device tree in NVIDIA's L4T kernel sources
#   (https://docs.nvidia.com/jetson/archives/l4t-archived/l4t-3261/index.html).
# * EMC: the rates of the Nano's EMC table (nvidia,emc-table in the P3448 device tree of the
#   same L4T sources; 1600 MHz is the LPDDR4 maximum jetson_clocks sets).
GPU_HZ = tuple(76_800_000 * k for k in range(1, 13))
EMC_HZ = (204_000_000, 408_000_000, 665_600_000, 800_000_000, 1_065_600_000, 1_331_200_000, 1_600_000_000)

# Where the two devfreq devices live in the tree (the L4T GPU node, and the EMC as a devfreq
# device would appear under /sys/class/devfreq).
DEVFREQ_DIRS = {"gpu": "sys/devices/57000000.gpu/devfreq/57000000.gpu", "emc": "sys/class/devfreq/emc"}
KNOBS = ("governor", "min_freq", "max_freq", "cur_freq")


class NanoPort:
    """A :class:`hetsched.ClockPort` over the Nano's GPU and EMC devfreq directories.

    A frequency is set by pinning ``min_freq`` and ``max_freq`` to it (in the order the kernel
    accepts: devfreq refuses a minimum above the maximum).

    :param root: the sysfs root (``/`` on the board).
    :param clock: monotonic seconds.
    :param power_w: board input power now (on a Nano: the INA3221 ``POM_5V_IN`` channel).
    :param settle: called after every write; stands in for the kernel driver in a fake tree.
    """

    soc: str | None = "jetson-nano"
    # What this port can do beyond the protocol's methods (hetsched.ClockPort): it publishes no
    # governor state (no run/hetsched directory), and its snapshots carry the board's power.
    state_dir = None
    integrates_samples_by_telemetry = False

    def __init__(
        self,
        root: Path,
        *,
        clock: Callable[[], float],
        power_w: Callable[[], float],
        settle: Callable[[], None] | None = None,
    ) -> None:
        self._dirs = {name: root / rel for name, rel in DEVFREQ_DIRS.items()}
        self._clock = clock
        self._power_w = power_w
        self._settle = settle
        # devfreq publishes no transition latency: these are orders of magnitude for a GPU
        # and a memory controller clock change (what the governor weighs phase lengths by).
        self._domains = {
            "gpu": DomainSpec("gpu", "gpu", self._available("gpu"), transition_latency_s=5e-3),
            "emc": DomainSpec("emc", "memory", self._available("emc"), transition_latency_s=8e-3),
        }

    def _available(self, name: str) -> tuple[int, ...]:
        return tuple(sorted(int(f) for f in (self._dirs[name] / "available_frequencies").read_text().split()))

    def _get(self, name: str, knob: str) -> str:
        return (self._dirs[name] / knob).read_text().strip()

    def _set(self, name: str, knob: str, value: object) -> None:
        (self._dirs[name] / knob).write_text(f"{value}\n")

    # -- the ClockPort protocol ----------------------------------------------------------
    def domains(self) -> Mapping[str, DomainSpec]:
        return self._domains

    def now(self) -> float:
        return self._clock()

    def sample(self) -> Snapshot | None:
        return Snapshot(time_s=self._clock(), total_power_w=self._power_w(), soc=self.soc)

    def save(self) -> dict[str, dict[str, str]]:
        return {name: {k: self._get(name, k) for k in ("governor", "min_freq", "max_freq")} for name in self._dirs}

    def restore(self, saved: dict[str, dict[str, str]]) -> None:
        for name, knobs in saved.items():
            self._set(name, "min_freq", self._domains[name].min_hz)  # so any saved max is accepted
            self._set(name, "max_freq", knobs["max_freq"])
            self._set(name, "min_freq", knobs["min_freq"])
            self._set(name, "governor", knobs["governor"])
        if self._settle is not None:
            self._settle()

    def write(self, domain: str, hz: int) -> None:
        if hz >= int(self._get(domain, "max_freq")):
            self._set(domain, "max_freq", hz)
            self._set(domain, "min_freq", hz)
        else:
            self._set(domain, "min_freq", hz)
            self._set(domain, "max_freq", hz)
        if self._settle is not None:
            self._settle()

    def read(self, domain: str) -> int | None:
        return int(self._get(domain, "cur_freq"))


class FakeNano:
    """The fake tree plus what the real board would do: the kernel's clamp and the workload."""

    # seconds per unit of work = fixed + sum(cycles / f); watts = static + sum(k * (f in GHz)^2)
    FIXED_S: ClassVar[dict[Phase, float]] = {Phase.PREPROCESS: 0.008, Phase.INFER: 0.015}  # CPU-side work the clocks do not touch
    WORK: ClassVar[dict[Phase, dict[str, float]]] = {
        Phase.PREPROCESS: {"emc": 12e6, "gpu": 2e6},
        Phase.INFER: {"gpu": 30e6, "emc": 10e6},
    }
    WATTS_PER_GHZ2: ClassVar[dict[str, float]] = {"gpu": 4.5, "emc": 0.7}
    STATIC_W = 1.3

    def __init__(self, root: Path) -> None:
        self.root = root
        self.t = 0.0
        self.power = self.STATIC_W
        self.energy_j = 0.0
        self._kernel_pick = {"gpu": GPU_HZ[5], "emc": EMC_HZ[-1]}  # what the kernel governors run at
        for name, avail, gov in (("gpu", GPU_HZ, "nvhost_podgov"), ("emc", EMC_HZ, "simple_ondemand")):
            d = root / DEVFREQ_DIRS[name]
            d.mkdir(parents=True)
            (d / "available_frequencies").write_text(" ".join(map(str, avail)) + "\n")
            for knob, value in (("governor", gov), ("min_freq", avail[0]), ("max_freq", avail[-1])):
                (d / knob).write_text(f"{value}\n")
        self.settle()

    def knobs(self) -> dict[str, bytes]:
        return {f"{n}/{k}": (self.root / d / k).read_bytes() for n, d in DEVFREQ_DIRS.items() for k in KNOBS}

    def clocks(self) -> dict[str, int]:
        return {n: int((self.root / d / "cur_freq").read_text()) for n, d in DEVFREQ_DIRS.items()}

    def settle(self) -> None:
        """The devfreq core: the governor's pick, clamped to [min_freq, max_freq]."""
        for name, rel in DEVFREQ_DIRS.items():
            d = self.root / rel
            lo, hi = int((d / "min_freq").read_text()), int((d / "max_freq").read_text())
            (d / "cur_freq").write_text(f"{min(max(self._kernel_pick[name], lo), hi)}\n")

    def run(self, phase: Phase, gov: Governor, tick_s: float = 0.01) -> None:
        """One unit of ``phase`` at the clocks in effect, with a telemetry tick every ``tick_s``."""
        f = self.clocks()
        seconds = self.FIXED_S[phase] + sum(cycles / f[d] for d, cycles in self.WORK[phase].items())
        self.power = self.STATIC_W + sum(k * (f[d] / 1e9) ** 2 for d, k in self.WATTS_PER_GHZ2.items())
        self.energy_j += self.power * seconds
        left = seconds
        while left > 0:
            step = min(tick_s, left)
            self.t += step
            left -= step
            gov.tick()


def frames(nano: FakeNano, gov: Governor, n: int) -> tuple[float, float]:
    """``n`` camera frames (preprocess, infer); returns (seconds, joules) per frame."""
    t0, e0 = nano.t, nano.energy_j
    for _ in range(n):
        for phase in (Phase.PREPROCESS, Phase.INFER):
            with gov.phase(phase):
                nano.run(phase, gov)
    return (nano.t - t0) / n, (nano.energy_j - e0) / n


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="hetsched-nano-") as tmp:
        nano = FakeNano(Path(tmp))
        port: ClockPort = NanoPort(Path(tmp), clock=lambda: nano.t, power_w=lambda: nano.power, settle=nano.settle)
        print("domains:", {n: f"{len(s.available_hz)} steps {s.min_hz / 1e6:g}-{s.max_hz / 1e6:g} MHz"
                           for n, s in port.domains().items()})
        before = nano.knobs()
        with Governor(port=port, slowdown=0.05, workload="nano-camera") as gov:
            frames(nano, gov, 400)  # auto-tunes online
            print("clocks while governed:", {n: f"{hz / 1e6:g} MHz" for n, hz in nano.clocks().items()})
            seconds, joules = frames(nano, gov, 100)  # tuned
            stats = gov.statistics()
        for phase, model in gov.profile().phases.items():
            print(f"chose for {phase}: {model.best}")
        print(f"tuned frame: {seconds * 1e3:.1f} ms, {joules:.3f} J; {stats.writes} clock writes, "
              f"{stats.tuning_measurements} tuning runs")
        after = nano.knobs()
        changed = sorted(k for k in before if before[k] != after[k])
        if changed:
            raise SystemExit(f"not restored: {changed}")
        print(f"every clock restored ({len(before)} knobs as before):",
              {n: f"{hz / 1e6:g} MHz" for n, hz in nano.clocks().items()})


if __name__ == "__main__":
    main()
