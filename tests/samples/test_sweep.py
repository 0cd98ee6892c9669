"""samples/zoo/sweep.py check: OK where tileweave's reference matches the stored onnxruntime output, BAD where it
does not, FAIL with the one-line reason where a model cannot be run, exit 1 if any is not OK, and a one-line
error (exit 2) for a folder with nothing exported in it. (`export` needs torch: the generation venv.)"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

ZOO = Path(__file__).resolve().parents[2] / "samples" / "zoo"
sys.path.insert(0, str(ZOO))
sys.dont_write_bytecode = True
import sweep  # noqa: E402


def _export(folder: Path, name: str, scale: float = 1.0) -> None:
    """The zoo's llama as if `sweep.py export` had written it (its output renamed `y`, optionally scaled)."""
    shutil.copy(ZOO / "llama.onnx", folder / f"{name}.onnx")
    data = np.load(ZOO / "llama.io.npz")
    np.savez(folder / f"{name}.io.npz", input_ids=data["input_ids"], y=data["last_hidden_state"] * scale)


def test_check_reports_each_model_and_fails_on_a_mismatch(tmp_path, capsys):
    _export(tmp_path, "good_o23")
    assert sweep.main(["check", str(tmp_path)]) == 0
    assert "good_o23" in capsys.readouterr().out.split("OK")[0]
    _export(tmp_path, "wrong_o23", scale=1.5)
    (tmp_path / "broken_o23.onnx").write_bytes(b"not onnx")
    np.savez(tmp_path / "broken_o23.io.npz", y=np.ones(1, np.float32))
    (tmp_path / "lonely_o23.onnx").write_bytes((tmp_path / "good_o23.onnx").read_bytes())
    assert sweep.main(["check", str(tmp_path)]) == 1
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert " OK " in lines["good_o23"] and " BAD " in lines["wrong_o23"]
    assert " FAIL " in lines["broken_o23"] and "is not an ONNX file" in lines["broken_o23"]
    assert " FAIL no lonely_o23.io.npz" in lines["lonely_o23"]


def test_an_empty_folder_is_a_one_line_error(tmp_path, capsys):
    assert sweep.main(["check", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no .onnx files") and "\n" not in err


def test_check_runs_each_backend_it_is_given(tmp_path, capsys):
    _export(tmp_path, "good_o23")
    assert sweep.main(["check", str(tmp_path), "--backends", "reference,cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines] == [["good_o23", "reference", "OK"], ["good_o23", "cpu", "OK"]]


def test_an_unknown_backend_is_a_usage_error(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as stop:
        sweep.main(["check", str(tmp_path), "--backends", "cpu,gpu"])
    assert stop.value.code == 2 and "unknown backend(s) gpu" in capsys.readouterr().err
