"""The Rockchip BSP part of a board tree: devfreq GPU/NPU/DMC, RKNPU debugfs, the PD supply.

Paths and formats follow the vendor BSP (``docs/sources.md``: [rk-bsp-dtsi] device names and
thresholds, [rk-sysfs-captures] real listings, [rknpu-driver] the ``load`` string): the Mali
``freq_table`` lists frequencies from the top OPP down, the vendor ``load`` attribute reads
``<busy%>@<Hz>Hz``, ``rknpu/load`` is root-only debugfs, and the USB-PD supply shows the
negotiated contract, not a measurement (RK3588 boards have no power sensor).
"""

from __future__ import annotations

from .schema import DomainProfile
from .state import BoardState
from .tree_files import TreeFiles

__all__ = ["RockchipTree"]

_DEVFREQ_NAMES = {"gpu": "fb000000.gpu", "npu": "fdab0000.npu", "memory": "dmc"}
_OF_NODES = {"gpu": "gpu@fb000000", "npu": "npu@fdab0000", "memory": "dmc"}
_PD_SUPPLY = "sys/devices/platform/feac0000.i2c/i2c-4/4-0022/power_supply/tcpm-source-psy-4-0022"


class RockchipTree:
    """Writes the vendor-specific files of a Rockchip BSP board into ``files``."""

    def __init__(self, files: TreeFiles) -> None:
        self.files = files

    def devfreq_dir(self, d: DomainProfile) -> tuple[str, str]:
        """(devfreq device name, its directory relative to the root) of a non-CPU domain."""
        name = _DEVFREQ_NAMES[d.kind]
        return name, f"sys/devices/platform/{name}/devfreq/{name}"

    def domain_static(self, d: DomainProfile) -> None:
        t = self.files
        name, df = self.devfreq_dir(d)
        dev = f"sys/devices/platform/{name}"
        freqs = [o.freq_hz for o in d.opps]
        if d.kind == "gpu":
            freqs = freqs[::-1]  # kbase fills freq_table from the top OPP down
        t.devfreq_static(d, name, df, freqs, dev)
        of = f"sys/firmware/devicetree/base/{_OF_NODES[d.kind]}"
        t.put(f"{of}/name", _OF_NODES[d.kind].split("@")[0] + "\0")
        t.link(f"{dev}/of_node", of)
        t.put(f"{dev}/uevent", f"OF_NAME={_OF_NODES[d.kind].split('@')[0]}\n")
        if d.kind != "npu":
            t.put(f"{df}/polling_interval", "50\n", 0o644)
            t.put(f"{df}/timer", "deferrable\n", 0o644)
        if d.kind == "memory":
            t.put(f"{df}/upthreshold", "25\n", 0o644)
            t.put(f"{df}/downdifferential", "20\n", 0o644)
            t.put(f"{df}/system_status", "0x0\n", 0o644)

    def domain_render(self, d: DomainProfile, state: BoardState) -> None:
        t = self.files
        df = t.dyn[d.name]
        ds = state.domains[d.name]
        t.devfreq_render(d, state, df)
        pct = min(100, max(0, round(ds.util * 100)))
        t.put(df / "load", f"{pct}@{ds.cur_hz}Hz\n")
        if d.kind == "gpu":
            t.put("sys/devices/platform/fb000000.gpu/utilisation", f"{pct}\n")

    def extras_static(self) -> None:
        t = self.files
        t.mkdir("sys/kernel/debug", 0o700)
        t.mkdir("sys/kernel/debug/rknpu", 0o700)
        t.put("sys/kernel/debug/rknpu/version", "RKNPU driver: v0.9.8\n", 0o400)
        t.put("sys/kernel/debug/rknpu/power", "on\n", 0o600)
        t.put("sys/kernel/debug/rknpu/volt", "850000\n", 0o400)
        t.put("sys/kernel/debug/rknpu/delayms", "2000\n", 0o600)
        t.put("sys/module/rknpu/version", "0.9.8\n")
        for f, v in (("online", "1"), ("type", "USB"), ("usb_type", "C [PD] PD_PPS"),
                     ("voltage_now", "20000000"), ("voltage_min", "20000000"), ("voltage_max", "20000000"),
                     ("current_now", "1500000"), ("current_max", "1500000")):  # fmt: skip
            t.put(f"{_PD_SUPPLY}/{f}", f"{v}\n")
        t.link("sys/class/power_supply/tcpm-source-psy-4-0022", _PD_SUPPLY)

    def extras_render(self, state: BoardState) -> None:
        t = self.files
        npu = state.domains["npu"]
        pct = min(100, max(0, round(npu.util * 100)))
        load = "NPU load: " + "".join(f" Core{i}: {pct:2d}%," for i in range(3)) + "\n"
        t.put("sys/kernel/debug/rknpu/load", load, 0o400)
        t.put("sys/kernel/debug/rknpu/freq", f"{npu.cur_hz}\n", 0o400)
