"""Durable files for the crash-safe files of `peers` (checkpoints, the data ledger, imports): written and fsynced,
directories' entries fsynced, and content digests.

- `write_durable`: write bytes and fsync them; `fsync_file`: fsync a file written by someone else (safetensors)
- `fsync_dir`: make a directory's entries (renames, new files) durable
- `sha256_file`: a file's SHA-256, read in 1 MiB chunks
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def write_durable(path: Path, data: bytes) -> str:
    """Write `data` to `path` and fsync it; its SHA-256 (hex)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
