"""Writing files so that a reader, or a process killed mid-write, never sees half of one: bytes in,
a file that is either wholly the old one or wholly the new one out."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: bytes, *, durable: bool = False) -> Path:
    """Write `data` to a temp file in `path`'s folder, then rename it over `path` (a rename within one
    file system is atomic). `durable`: fsync the file before the rename and the folder after it, so the
    new content also survives a power cut, not only a killed process (the workbench's autosave; caches
    need not pay for it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return path
