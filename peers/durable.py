"""`fsync_dir`: make a directory's entries (renames, new files) durable, for the crash-safe files of `peers`."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync directory `path`; a no-op where directories cannot be opened (some platforms and filesystems)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
