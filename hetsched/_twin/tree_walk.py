"""Path resolution below a twin root that never leaves it: the twin's writer-side containment.

:class:`ContainedRoot` resolves a root-relative path the way the kernel would, but by hand,
one component at a time from a descriptor of the root: each directory is opened relative to
its parent's descriptor with ``O_NOFOLLOW``, and each symlink met is read (``readlinkat``) and
its target walked in turn. A target that stays inside the root is followed (sysfs is full of
such links); an absolute target elsewhere, or a ``..`` above the root, is refused with
:class:`~hetsched.PathOutsideRootError` before anything is opened there. Because every step is
relative to a descriptor already known to lie inside, a link swapped in after a check cannot
redirect a later step (the walk sees the link, not its target).

This is the rule :class:`~hetsched._platform._fs.SysfsRoot` applies to readers (real paths,
nothing outside the root); it lives here because the twin may not depend on ``_platform``.

Descriptors are cached for one :meth:`ContainedRoot.batch` (a render, a poll) and closed at
its end; outside a batch each operation opens and closes its own. Within a batch a directory
already opened is reached through its descriptor, so a link swapped in for it meanwhile is not
followed either: the batch goes on writing into the directory it opened.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .._errors import PathOutsideRootError, TwinError

__all__ = ["ContainedRoot"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40  # the kernel's MAXSYMLINKS

Real = tuple[str, ...]
"""A directory's link-free components below the root."""


class ContainedRoot:
    """Descriptor-relative access below ``root``; see the module docstring.

    Not thread-safe (one twin drives one tree).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._root_s = os.fspath(root).rstrip(os.sep) or os.sep
        self._real_root = ""
        self._depth = 0
        self._fds: dict[Real, int] = {}
        self._keys: dict[str, Real] = {}
        """Requested directory path -> where it resolved (found ones only: a missing one may be made)."""

    # -- batches --------------------------------------------------------------------------

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Keep directory descriptors open until the outermost batch ends (nests)."""
        if self._depth == 0:
            self._real_root = os.path.realpath(self._root_s)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._drop(())

    def _drop(self, under: Real) -> None:
        """Close and forget every cached descriptor at or below ``under``."""
        n = len(under)
        for real in [r for r in self._fds if r[:n] == under]:
            os.close(self._fds.pop(real))
        for key in [k for k, r in self._keys.items() if r[:n] == under]:
            del self._keys[key]

    # -- paths ----------------------------------------------------------------------------

    def split(self, rel: str | Path) -> tuple[Path, list[str]]:
        """(absolute path, its components below the root) of ``rel`` (relative, or absolute below the root).

        Raises:
            PathOutsideRootError: an absolute ``rel`` that is not below the root.
        """
        p = rel if isinstance(rel, Path) and rel.is_absolute() else self.root / rel
        s = os.fspath(p)
        prefix = self._root_s if self._root_s.endswith(os.sep) else self._root_s + os.sep
        if not s.startswith(prefix):
            raise PathOutsideRootError(errno.EXDEV, f"refusing {s}: outside the twin root {self._root_s}")
        return p, [c for c in s[len(prefix) :].split(os.sep) if c not in ("", ".")]

    def _outside(self, what: str, link: Real, target: str) -> PathOutsideRootError:
        where = "/".join(link) or "."
        return PathOutsideRootError(
            errno.EXDEV,
            f"refusing to {what}: {where} (under {self._root_s}) leads to {target!r}, outside the twin root; "
            "nothing outside was touched",
        )

    def _fd(self, real: Real) -> int:
        fd = self._fds.get(real)
        if fd is None:  # only the root is opened here: deeper ones are cached by walk()
            assert not real
            try:
                fd = os.open(self._real_root or self._root_s, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                raise TwinError(f"cannot open the twin root {self._root_s}: {exc.strerror or exc}") from exc
            self._fds[real] = fd
        return fd

    def _follow(self, real: Real, name: str, target: str, what: str) -> tuple[Real, list[str]]:
        """Where the walk goes on after the link ``real/name -> target``: (directory, components left)."""
        if not target:
            raise TwinError(f"cannot {what}: {'/'.join((*real, name))} is an empty symlink")
        if not os.path.isabs(target):
            return real, target.split("/")
        resolved = os.path.realpath(target)
        root = self._real_root or os.path.realpath(self._root_s)
        if resolved == root:
            return (), []
        prefix = root if root.endswith(os.sep) else root + os.sep
        if not resolved.startswith(prefix):
            raise self._outside(what, (*real, name), target)
        return (), resolved[len(prefix) :].split(os.sep)

    def walk(self, parts: list[str], *, create: bool, what: str) -> Real | None:
        """The real components of the directory ``parts`` names, its descriptor cached.

        ``create``: make missing directories (0755). Without it, None when a component is
        missing or is not a directory.

        Raises:
            PathOutsideRootError: a link on the way leads outside the root, or ``..`` climbs above it.
            TwinError: (``create``) a file is in the way, too many links, or a directory cannot be made.
        """
        key = "/".join(parts)
        hit = self._keys.get(key)
        if hit is not None:
            return hit
        real: list[str] = []
        todo = list(reversed(parts))
        hops = 0
        while todo:
            c = todo.pop()
            if c in ("", "."):
                continue
            if c == "..":
                if not real:
                    raise self._outside(what, (), "..")
                real.pop()
                continue
            here = tuple(real)
            child = (*here, c)
            if child in self._fds:
                real.append(c)
                continue
            parent = self._fd(here)
            try:
                fd = os.open(c, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    return None
                hops += 1
                if hops > _MAX_LINKS:
                    raise TwinError(f"cannot {what}: cannot make {'/'.join(child)}") from None
                try:
                    os.mkdir(c, 0o755, dir_fd=parent)
                except FileExistsError:
                    pass  # raced, or a dangling link: the next open decides
                except OSError as exc:
                    raise TwinError(f"cannot {what}: making {'/'.join(child)} failed: {exc.strerror}") from exc
                todo.append(c)
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise TwinError(f"cannot {what}: opening {'/'.join(child)} failed: {exc.strerror}") from exc
                try:
                    target = os.readlink(c, dir_fd=parent)
                except OSError:  # not a link: a file where a directory should be
                    if not create:
                        return None
                    raise TwinError(f"cannot {what}: {'/'.join(child)} is not a directory") from exc
                hops += 1
                if hops > _MAX_LINKS:
                    raise TwinError(f"cannot {what}: too many levels of symlinks at {'/'.join(child)}") from exc
                base, more = self._follow(here, c, target, what)
                real = list(base)
                todo.extend(reversed(more))
                continue
            self._fds[child] = fd
            real.append(c)
        out = tuple(real)
        self._keys[key] = out
        return out

    def parent(self, parts: list[str], *, create: bool, what: str) -> tuple[int, str, Real]:
        """(descriptor of the parent directory, last name, parent's real components); no link at the name followed.

        Raises:
            PathOutsideRootError: a link in a parent leads outside the root.
            TwinError: the parent is missing (and not ``create``), or ``parts`` names no file.
        """
        if not parts or parts[-1] == "..":
            raise TwinError(f"cannot {what}: not a file below the twin root")
        real = self.walk(parts[:-1], create=create, what=what)
        if real is None:
            raise FileNotFoundError(errno.ENOENT, "missing parent", "/".join(parts[:-1]))
        return self._fd(real), parts[-1], real

    def resolve(self, parts: list[str], *, create: bool, what: str) -> tuple[int, str, os.stat_result | None] | None:
        """Where a write of ``parts`` lands: (parent descriptor, name, ``lstat`` of the name or None).

        Links at the name are followed while they stay inside the root (a dangling one gives
        its target). None when a parent directory is missing and not ``create``.

        Raises:
            PathOutsideRootError: ``parts`` or a link on the way leads outside the root.
            TwinError: too many links, or a file is in the way of a directory to create.
        """
        hops = 0
        while True:
            try:
                dfd, name, real = self.parent(parts, create=create, what=what)
            except FileNotFoundError:
                return None
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return dfd, name, None
            except OSError as exc:
                raise TwinError(f"cannot {what}: {exc.strerror}") from exc
            if not stat.S_ISLNK(st.st_mode):
                return dfd, name, st
            hops += 1
            if hops > _MAX_LINKS:
                raise TwinError(f"cannot {what}: too many levels of symlinks")
            try:
                target = os.readlink(name, dir_fd=dfd)
            except OSError as exc:  # swapped since the lstat
                raise TwinError(f"cannot {what}: {exc.strerror}") from exc
            base, more = self._follow(real, name, target, what)
            parts = [*base, *more]

    # -- operations -----------------------------------------------------------------------

    def unlink(self, parts: list[str], *, what: str) -> None:
        """Delete the entry ``parts`` names (a link itself); nothing when it or its parent is absent."""
        try:
            dfd, name, _ = self.parent(parts, create=False, what=what)
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise TwinError(f"cannot {what}: {exc.strerror}") from exc

    def rmtree_files(self, parts: list[str], *, what: str) -> None:
        """Delete the directory ``parts`` names and the files in it (never below: it holds files only)."""
        real = self.walk(parts, create=False, what=what)
        if real is None:
            return
        if not real:
            raise TwinError(f"cannot {what}: it is the twin root")
        fd = self._fd(real)
        try:
            for name in os.listdir(fd):
                os.unlink(name, dir_fd=fd)  # a directory in there fails: EISDIR
            parent = self._fd(real[:-1])
            self._drop(real)
            os.rmdir(real[-1], dir_fd=parent)
        except OSError as exc:
            raise TwinError(f"cannot {what}: {exc.strerror}") from exc

    def chmod_dir(self, parts: list[str], mode: int, *, create: bool, what: str) -> None:
        """Set the mode of the directory ``parts`` names (made first with ``create``; else nothing when absent)."""
        real = self.walk(parts, create=create, what=what)
        if real is None:
            return
        try:
            os.fchmod(self._fd(real), mode)
        except OSError as exc:
            raise TwinError(f"cannot {what}: {exc.strerror}") from exc
