"""A state directory's files opened and checked (``serve --state-dir``, :mod:`._durable`):
without following a symbolic link, this user's, not writable by group or others; every failure a
:class:`StateError` naming the file."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Final

__all__ = ["NOFOLLOW", "StateError", "check_owned", "open_directory", "write_all"]

NOFOLLOW: Final = os.O_NOFOLLOW | os.O_CLOEXEC


class StateError(Exception):
    """The state directory cannot be used, or a decision cannot be logged; the message names
    it and what went wrong."""


def check_owned(info: os.stat_result, where: str, *, file: bool) -> None:
    if file and not stat.S_ISREG(info.st_mode):
        raise StateError(f"state_dir: {where} is not a regular file; remove it")
    if info.st_uid != os.geteuid():
        raise StateError(
            f"state_dir: {where} belongs to another user (uid {info.st_uid}); it decides what is"
            f" counted, so it must be this user's"
        )
    if file and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateError(
            f"state_dir: {where} can be written by group or others; it decides what is counted"
            f" (chmod go-w it)"
        )


def open_directory(path: Path, notes: list[str]) -> int:
    """Open (make, ``0700``, when missing) the state directory without following a symbolic
    link; refused unless it is this user's. Group and other permissions are taken away."""
    flags = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW
    shown = repr(str(path))
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StateError(f"state_dir: cannot create {shown}: {exc}") from None
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise StateError(f"state_dir: cannot open {shown}: {exc}") from None
    except OSError as exc:
        if path.is_symlink():
            raise StateError(
                f"state_dir: {shown} is a symbolic link; give the directory itself (another"
                f" user who can change the link could change what is counted)"
            ) from None
        if exc.errno == errno.ENOTDIR:
            raise StateError(f"state_dir: cannot create {shown}: a file is in the way") from None
        raise StateError(f"state_dir: cannot open {shown}: {exc}") from None
    try:
        info = os.fstat(fd)
        check_owned(info, shown, file=False)
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            os.fchmod(fd, 0o700)
            notes.append(f"{shown} was mode {mode:04o}; made 0700 (only this user may read it)")
    except OSError as exc:
        os.close(fd)
        raise StateError(f"state_dir: cannot make {shown} 0700: {exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
