"""Governor profiles: what auto-tune learned, saved as JSON per board and workload."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .._errors import NotRegularFileError, ProfileError
from .._platform.files import read_regular_file
from ._model import PhaseModel
from ._phase import Phase
from ._points import DomainSpec

__all__ = ["BoardId", "GovernorProfile"]

_FORMAT = "hetsched.governor-profile"
_VERSION = 1


@dataclass(frozen=True)
class BoardId:
    """What makes two boards interchangeable for a profile: the SoC and every domain's table."""

    soc: str | None
    domains: Mapping[str, tuple[int, ...]]

    @staticmethod
    def of(soc: str | None, domains: Mapping[str, DomainSpec]) -> BoardId:
        return BoardId(soc, MappingProxyType({n: d.available_hz for n, d in sorted(domains.items())}))

    def to_json(self) -> dict[str, object]:
        return {"soc": self.soc, "domains": {n: list(hz) for n, hz in sorted(self.domains.items())}}

    @staticmethod
    def from_json(obj: object) -> BoardId:
        if not isinstance(obj, dict) or not isinstance(obj.get("domains"), dict):
            raise ProfileError(f"profile 'board' must be {{'soc': ..., 'domains': {{...}}}}, got {obj!r}")
        soc = obj.get("soc")
        if soc is not None and not isinstance(soc, str):
            raise ProfileError(f"profile board.soc must be a string or null, got {soc!r}")
        domains: dict[str, tuple[int, ...]] = {}
        for name, hz in obj["domains"].items():
            if not isinstance(hz, list) or not hz or not all(isinstance(h, int) and h > 0 for h in hz):
                raise ProfileError(f"profile board.domains.{name}: expected a list of positive integers (Hz)")
            domains[name] = tuple(hz)
        return BoardId(soc, MappingProxyType(domains))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BoardId) and self.soc == other.soc and dict(self.domains) == dict(other.domains)

    def __hash__(self) -> int:
        return hash((self.soc, tuple(sorted(self.domains.items()))))


@dataclass(frozen=True)
class GovernorProfile:
    """Per-phase tuned models for one board and one workload.

    Save with :meth:`save`, reload with :meth:`load`; a governor given a profile skips
    auto-tune for the phases it covers.
    """

    board: BoardId
    workload: str
    slowdown: float
    phases: Mapping[Phase, PhaseModel] = field(default_factory=lambda: MappingProxyType({}))

    def to_json(self) -> dict[str, object]:
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "board": self.board.to_json(),
            "workload": self.workload,
            "slowdown": self.slowdown,
            "phases": {str(p): m.to_json() for p, m in sorted(self.phases.items())},
        }

    @staticmethod
    def from_json(obj: object, *, source: str = "profile") -> GovernorProfile:
        """:raises ProfileError: not a governor profile, another version, or a malformed field."""
        if not isinstance(obj, dict) or obj.get("format") != _FORMAT:
            raise ProfileError(f"{source}: not a hetsched governor profile (expected format {_FORMAT!r})")
        if obj.get("version") != _VERSION:
            raise ProfileError(f"{source}: unsupported profile version {obj.get('version')!r} (this hetsched reads {_VERSION})")
        workload = obj.get("workload")
        slowdown = obj.get("slowdown")
        if not isinstance(workload, str):
            raise ProfileError(f"{source}: 'workload' must be a string")
        if isinstance(slowdown, bool) or not isinstance(slowdown, int | float) or not math.isfinite(slowdown) or slowdown < 0:
            raise ProfileError(f"{source}: 'slowdown' must be a finite non-negative number, got {slowdown!r}")
        raw = obj.get("phases")
        if not isinstance(raw, dict):
            raise ProfileError(f"{source}: 'phases' must be an object")
        phases: dict[Phase, PhaseModel] = {}
        for name, model in raw.items():
            try:
                phase = Phase(name)
            except ValueError as exc:
                raise ProfileError(f"{source}: unknown phase {name!r}; known: {[p.value for p in Phase]}") from exc
            phases[phase] = PhaseModel.from_json(model, f"{source}: phases.{name}")
        return GovernorProfile(BoardId.from_json(obj.get("board")), workload, float(slowdown), MappingProxyType(phases))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the profile as JSON (atomically: a temp file renamed over ``path``)."""
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)

    @staticmethod
    def load(path: str | os.PathLike[str], *, board: BoardId | None = None) -> GovernorProfile:
        """Read a profile; with ``board``, also check it was made on an identical board.

        :raises ProfileError: unreadable, not UTF-8 text (a binary file), not JSON, malformed
            (a field missing or of the wrong type, at any depth), or made for another board;
            the message names the file.
        """
        where = os.fspath(path)
        try:
            data = read_regular_file(path, what="governor profile")
        except NotRegularFileError as exc:
            raise ProfileError(str(exc)) from exc
        except OSError as exc:
            raise ProfileError(f"cannot read governor profile {where}: {exc.strerror or exc}") from exc
        try:
            obj = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ProfileError(f"governor profile {where} is not UTF-8 text (a binary file?): {exc.reason} "
                               f"at byte {exc.start}") from exc
        except json.JSONDecodeError as exc:
            raise ProfileError(f"governor profile {where} is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise ProfileError(f"governor profile {where} is nested too deeply to be a profile") from exc
        try:
            profile = GovernorProfile.from_json(obj, source=where)
        except ProfileError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
            # A value of the wrong type deep in a phase model (a string where a frequency belongs).
            raise ProfileError(f"governor profile {where} is malformed: {type(exc).__name__}: {exc}") from exc
        if board is not None and profile.board != board:
            raise ProfileError(
                f"governor profile {where} was made on another board "
                f"(soc {profile.board.soc!r}, domains {sorted(profile.board.domains)}); "
                f"this one is soc {board.soc!r}, domains {sorted(board.domains)}"
            )
        return profile
