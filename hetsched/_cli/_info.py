"""``hetsched info [--root DIR] [--json]``: describe the board under a sysfs root."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._common import existing_dir

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "info",
        help="describe the board (SoC, CPU clusters, GPU/NPU/memory clocks, thermal zones, power rails)",
        description="Discover the board under a sysfs root (the real one, or a twin's) and print it.",
    )
    parser.add_argument("--root", default="/", metavar="DIR", type=existing_dir, help="sysfs root: '/' on a board, or a twin's root (default /)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def _mhz(hz: int | None) -> str:
    return "-" if hz is None else f"{hz / 1e6:g}"


def _freqs_mhz(values: tuple[int, ...] | list[int], scale: float) -> str:
    if not values:
        return "-"
    mhz = [f"{v * scale / 1e6:g}" for v in values]
    if len(mhz) > 6:
        return f"{mhz[0]} .. {mhz[-1]} ({len(mhz)} steps)"
    return " ".join(mhz)


def format_table(info: dict[str, Any]) -> str:
    """Human-readable rendering of ``Platform.to_dict()``."""
    lines = []
    soc = info["soc"] or "unknown (not an RK3588/Orin board)"
    lines.append(f"SoC:       {soc}")
    if info.get("model"):
        lines.append(f"Model:     {info['model']}")
    if info.get("l4t_release"):
        lines.append(f"L4T:       R{info['l4t_release']} (JetPack {info.get('jetpack') or '?'})")
    lines.append(f"Root:      {info['root']}")
    lines.append(f"CPUs:      {len(info['cpus'])} online")
    lines.append("")
    lines.append("CPU clusters")
    if not info["cpu_clusters"]:
        lines.append("  (no cpufreq policies)")
    for c in info["cpu_clusters"]:
        cpus = ",".join(map(str, c["cpus"]))
        part = f" {c['cpu_part']}" if c.get("cpu_part") else ""
        cap = f" cap={c['capacity']}" if c.get("capacity") is not None else ""
        lines.append(
            f"  {c['name']:<10} cpus {cpus:<8}{part}{cap}  governor={c['governor'] or '-'}  "
            f"MHz: {_freqs_mhz(c['frequencies_khz'], 1e3)}  cur={_mhz(c['cur_khz'] * 1000 if c['cur_khz'] else None)}"
        )
    lines.append("")
    lines.append("Devices")
    if not info["devices"]:
        lines.append("  (no GPU/NPU/memory clock domains)")
    for d in info["devices"]:
        lines.append(
            f"  {d['kind']:<7}{d['name']:<16} governor={d['governor'] or '-'}  "
            f"MHz: {_freqs_mhz(d['frequencies_hz'], 1)}  max={_mhz(d['max_freq_hz'])}  cur={_mhz(d['cur_freq_hz'])}"
        )
    lines.append("")
    lines.append("Thermal zones")
    if not info["thermal_zones"]:
        lines.append("  (none)")
    for z in info["thermal_zones"]:
        temp = "offline" if z["temp_c"] is None else f"{z['temp_c']:.1f} C"
        trips = ", ".join(f"{t['type']} {t['temp_c']:g}" for t in z["trips"]) or "-"
        lines.append(f"  {z['index']:>2} {z['type']:<20} {temp:>9}   trips: {trips}")
    lines.append("")
    lines.append("Power rails")
    if not info["power_rails"]:
        lines.append("  (no power sensor)")
    for r in info["power_rails"]:
        sensor = f" ({r['sensor']})" if r.get("sensor") and r["sensor"] != "model" else ""
        lines.append(f"  {r['name']:<20} {r['source']}{sensor}")
    if "vulkan" in info:  # the RK3588's Mali GPU runs through ncnn over Vulkan
        lines.append("")
        lines.append("GPU compute (ncnn over Vulkan)")
        lines.extend(f"  {v}" for v in info["vulkan"] or ["(no Vulkan device: pip install 'hetsched[ncnn]' and a Vulkan driver)"])
    for note in info.get("notes", ()):
        lines.append(f"note: {note}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from hetsched._platform.discovery import discover

    platform = discover(args.root)
    if args.json:
        sys.stdout.write(platform.to_json() + "\n")
    else:
        info = platform.to_dict()
        if str(info.get("soc") or "").startswith("rk35"):
            from hetsched.backends._ncnn_convert import vulkan_devices

            info["vulkan"] = [d.describe() for d in vulkan_devices()]
        sys.stdout.write(format_table(info) + "\n")
    return 0
