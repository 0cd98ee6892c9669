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


def test_check_output_replaces_only_earlier_outputs_of_its_kind(tmp_path):
    import json
    import zipfile

    import onnx
    from support import sample_path

    from engine.errors import TileweaveError

    zipped, plan = tmp_path / "b.zip", tmp_path / "p.json"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("manifest.json", "{}")
    plan.write_text(json.dumps({"policy": "welder"}))
    assert files.check_output(zipped, "-o", kind="zip") == zipped
    assert files.check_output(plan, "--plan-out", kind="json") == plan
    for path, kind in ((zipped, "json"), (plan, "zip")):
        with pytest.raises(TileweaveError, match="exists and is not"):
            files.check_output(path, "--x", kind=kind)
    plain = tmp_path / "model.onnx"
    plain.write_bytes(sample_path("gelu_chain").read_bytes())
    with pytest.raises(TileweaveError, match="is not a model annotated by tileweave"):
        files.check_output(plain, "--annotated-onnx", kind="onnx")  # someone's model, not our annotation
    proto = onnx.load(str(plain))
    proto.metadata_props.add(key="tileweave.plan_hash", value="abc")
    onnx.save(proto, str(plain))
    assert files.check_output(plain, "--annotated-onnx", kind="onnx") == plain
    empty = tmp_path / "empty.npz"
    empty.touch()  # an empty file holds nothing to lose
    assert files.check_output(empty, "--outputs", kind="zip") == empty


def test_write_output_names_the_option(tmp_path):
    from engine.errors import TileweaveError

    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(TileweaveError, match="cannot write --plan-out") as err:
        files.write_output(target / "sub.json", "{}", "--plan-out")
    assert "\n" not in str(err.value)
