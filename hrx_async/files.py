"""Opening the files users name (weights, traces, inputs) without ever blocking on them.

A path may name a FIFO, a device or a directory. Opening it without blocking and checking
the descriptor (not the name) before a byte is read leaves no moment in which such a file,
or one put in the file's place, could make the open or a read wait forever.
"""

from __future__ import annotations

import os
import stat

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message ("a directory", ...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a special file"


class NotRegularFile(Exception):
    """The path names something other than a regular file (`kind` says what)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """A read-only descriptor on `path` and its `fstat`, checked to be a regular file.

    Raises what `os.open` raises (FileNotFoundError, ...) or `NotRegularFile`; the caller
    turns either into its own error. The descriptor is the caller's to close.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(file_kind(info.st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd, info


__all__ = ["NotRegularFile", "file_kind", "open_regular"]
