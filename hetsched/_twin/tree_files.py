"""The files of a twin board tree: atomic writes under a root, and the generic devfreq ABI.

:class:`TreeFiles` is the low-level half of :class:`~hetsched._twin.tree.BoardTree`: every
write goes through :meth:`TreeFiles.put` (temp file + ``os.replace``, remembering the bytes so
a live twin can tell the runtime's writes from its own), symlinks are relative, and nothing is
written outside the root. It also renders the devfreq class files both vendors share (Linux
``Documentation/ABI/testing/sysfs-class-devfreq``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from .._errors import PathOutsideRootError, TwinError
from .schema import DomainProfile, SocProfile
from .state import BoardState, governors_for

__all__ = ["OfflineStyle", "TreeFiles", "khz", "kernel_list"]

OfflineStyle = Literal["-256000", "eagain"]


def khz(hz: int) -> int:
    return hz // 1000


def kernel_list(values: Iterable[object]) -> str:
    """A sysfs list as the kernel prints it: ``"%u "`` per entry then ``"\\n"`` (a trailing space)."""
    return "".join(f"{v} " for v in values) + "\n"


class TreeFiles:
    """The files of one board under ``root``: atomic writes, links, and the knobs a live twin watches.

    Raises:
        TwinError: ``root`` exists and is not a directory.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        profile: SocProfile,
        variant: str | None = None,
        *,
        offline_style: OfflineStyle = "-256000",
    ) -> None:
        self.root = Path(root).absolute()
        if self.root.exists() and not self.root.is_dir():
            raise TwinError(f"twin root {self.root} exists and is not a directory")
        self.profile = profile
        self.variant = variant if variant is not None else profile.default_variant
        self.layout = profile.layout(self.variant)
        self.offline_style: OfflineStyle = offline_style
        self._written: dict[Path, bytes] = {}
        self.knobs: dict[Path, tuple[str, str]] = {}
        """Writable path -> (domain or "", knob) the live twin watches."""
        self.dyn: dict[str, Path] = {}
        """Dynamic files and directories by role (``zone_hwmon<N>``, a domain's devfreq dir, ...)."""
        self._userspace_dirs: dict[str, Path] = {}
        self._gov_parent: dict[str, Path] = {}

    # -- low level ------------------------------------------------------------

    def path(self, rel: str) -> Path:
        p = self.root / rel
        return p

    def put(self, rel: str | Path, text: str | bytes, mode: int = 0o444) -> Path:
        """Write ``text`` at ``rel`` (relative to the root) atomically with ``mode``.

        Raises:
            PathOutsideRootError: ``rel`` escapes the root.
        """
        p = rel if isinstance(rel, Path) and rel.is_absolute() else self.root / rel
        if not os.path.normpath(p).startswith(str(self.root) + os.sep):
            raise PathOutsideRootError(f"refusing to write {p}: outside twin root {self.root}")
        data = text.encode() if isinstance(text, str) else text
        if self._written.get(p) == data and p.exists():
            return p
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.twin-tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, p)
        self._written[p] = data
        return p

    def written(self, p: Path) -> bytes | None:
        """Bytes the twin itself last wrote at ``p``."""
        return self._written.get(p)

    def forget(self, p: Path) -> None:
        self._written.pop(p, None)

    def link(self, rel: str, target_rel: str) -> None:
        """Relative symlink at ``rel`` pointing at ``target_rel`` (both relative to the root)."""
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(self.root / target_rel, p.parent)
        if p.is_symlink() or p.exists():
            if p.is_symlink() and os.readlink(p) == target:
                return
            p.unlink()
        os.symlink(target, p)

    def mkdir(self, rel: str, mode: int = 0o755) -> Path:
        p = self.root / rel
        p.mkdir(parents=True, exist_ok=True)
        os.chmod(p, mode)
        return p

    # -- devfreq class files (both vendors) ----------------------------------------------

    def devfreq_static(self, d: DomainProfile, name: str, df: str, freqs: list[int], devpath: str) -> None:
        self.mkdir(df)
        self.put(f"{df}/available_frequencies", kernel_list(freqs))
        self.put(f"{df}/available_governors", kernel_list(governors_for(self.profile, d)))
        self.put(f"{df}/name", f"{name}\n")
        self.put(f"{df}/trans_stat", "")
        self.put(f"{df}/uevent", "")
        self.put(f"{df}/power/control", "auto\n", 0o644)
        self.put(f"{df}/power/runtime_status", "unsupported\n")
        self.link(f"{df}/subsystem", "sys/class/devfreq")
        self.link(f"{df}/device", devpath)
        self.link(f"sys/class/devfreq/{name}", df)
        for knob in ("governor", "min_freq", "max_freq"):
            self.knobs[self.path(f"{df}/{knob}")] = (d.name, knob)
        self.knobs[self.path(f"{df}/userspace/set_freq")] = (d.name, "set_freq")
        self._userspace_dirs[d.name] = self.path(f"{df}/userspace")
        self.dyn[d.name] = self.path(df)

    def devfreq_render(self, d: DomainProfile, state: BoardState, df: Path) -> None:
        ds = state.domains[d.name]
        self.put(df / "cur_freq", f"{ds.cur_hz}\n")
        self.put(df / "target_freq", f"{ds.cur_hz}\n")
        self.put(df / "governor", f"{ds.governor}\n", 0o644)
        self.put(df / "min_freq", f"{min(ds.min_hz, ds.effective_max())}\n", 0o644)
        self.put(df / "max_freq", f"{ds.effective_max()}\n", 0o644)
        lines = ["     From  :   To\n", "           :" + "".join(f"{o.freq_hz:>11}" for o in d.opps) + "   time(ms)\n"]
        for o in d.opps:
            mark = "*" if o.freq_hz == ds.cur_hz else " "
            lines.append(f"{mark}{o.freq_hz:>10}:" + "".join(f"{0:>11}" for _ in d.opps)
                         + f"{int(ds.time_in_state_s.get(o.freq_hz, 0.0) * 1000):>11}\n")
        lines.append(f"Total transition : {ds.transitions}\n")
        self.put(df / "trans_stat", "".join(lines))
        udir = self._userspace_dirs[d.name]
        if ds.governor == "userspace":
            sf = ds.setspeed_hz if ds.setspeed_hz is not None else ds.cur_hz
            self.put(udir / "set_freq", f"{sf}\n", 0o644)
            os.chmod(udir, 0o755)
        elif udir.exists():
            # The userspace governor's attribute group goes away with the governor.
            f = udir / "set_freq"
            if f.exists():
                self.forget(f)
                f.unlink()
            udir.rmdir()
