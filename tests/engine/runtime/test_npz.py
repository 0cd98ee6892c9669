"""engine/runtime/npz.py: .npz files NumPy itself cannot parse (seen on a GPU machine with numpy 2.5.2:
its own np.savez output failed np.load with a tokenize error) are read directly."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from engine.runtime.npz import read_npy_bytes, read_npz_arrays


def _npy_with_nul_padding(array: np.ndarray) -> bytes:
    """A format-1.0 .npy whose header is padded with NULs instead of spaces."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=(1, 0))
    data = bytearray(buf.getvalue())
    length = int.from_bytes(data[8:10], "little")
    header = data[10:10 + length].decode("latin1")
    body = header.rstrip(" \n")
    data[10:10 + length] = (body + "\x00" * (length - len(body) - 1) + "\n").encode("latin1")
    return bytes(data)


def _npz(path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name + ".npy", data)


def test_an_npz_numpy_cannot_parse_is_read_directly(tmp_path):
    rng = np.random.default_rng(5)
    arrays = {"x": rng.standard_normal((3, 4)).astype(np.float32), "ids": rng.integers(0, 9, (2, 5)),
              "f": np.asfortranarray(rng.standard_normal((4, 3)))}
    path = tmp_path / "nul.npz"
    _npz(path, {k: _npy_with_nul_padding(v) for k, v in arrays.items()})
    with pytest.raises(Exception):  # noqa: B017 - NumPy's own reader fails (a tokenize or value error)
        with np.load(path) as data:
            data["x"]
    back = read_npz_arrays(path)
    assert set(back) == set(arrays)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v)


def test_ordinary_files_go_through_numpy_and_bad_ones_fail_in_one_line(tmp_path):
    a = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    np.savez(tmp_path / "ok.npz", a=a)
    assert np.array_equal(read_npz_arrays(tmp_path / "ok.npz")["a"], a)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="NumPy could not read it .* nor could it be read directly") as err:
        read_npz_arrays(tmp_path / "junk.npz")
    assert "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError):
        read_npz_arrays(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="pickle"):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        read_npy_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="needs"):
        read_npy_bytes(_npy_with_nul_padding(a)[:-4])


def test_the_cli_reads_such_inputs(tmp_path):
    from engine.cli import main

    graph_inputs = {"x": np.random.default_rng(2).standard_normal((128, 3072)).astype(np.float32)}
    _npz(tmp_path / "in.npz", {"x": _npy_with_nul_padding(graph_inputs["x"])})
    from pathlib import Path

    model = Path(__file__).resolve().parents[3] / "samples" / "gelu_chain.onnx"
    assert main(["run", str(model), "--backend", "reference", "--inputs", str(tmp_path / "in.npz"),
                 "--outputs", str(tmp_path / "out.npz")]) == 0
