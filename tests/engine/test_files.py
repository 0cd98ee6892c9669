"""engine/files.py: an interrupted write leaves the old file whole and no temp file behind."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from engine import files


class CrashingFile(io.FileIO):
    """A real file whose write puts half the bytes on disk, then fails (a process dying mid-write)."""

    def write(self, data):
        super().write(bytes(data)[: len(data) // 2])
        super().flush()
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("durable", [False, True])
def test_write_replaces_the_file_whole(tmp_path, durable):
    rng = np.random.default_rng(3)
    path = tmp_path / "sub" / "state.bin"
    for _ in range(3):
        data = rng.integers(1, 256, size=int(rng.integers(1, 5000)), dtype=np.uint8).tobytes()
        assert files.write_atomic(path, data, durable=durable) == path
        assert path.read_bytes() == data
    assert os.listdir(path.parent) == ["state.bin"]


@pytest.mark.parametrize("durable", [False, True])
def test_a_crash_mid_write_leaves_the_old_file(tmp_path, monkeypatch, durable):
    rng = np.random.default_rng(4)
    path = tmp_path / "state.bin"
    old = rng.integers(1, 256, size=3000, dtype=np.uint8).tobytes()
    files.write_atomic(path, old)
    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode: CrashingFile(fd, "wb"))
    new = rng.integers(1, 256, size=5000, dtype=np.uint8).tobytes()
    with pytest.raises(OSError, match="No space"):
        files.write_atomic(path, new, durable=durable)
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["state.bin"]  # the half-written temp file is gone
