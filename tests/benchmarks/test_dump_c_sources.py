"""benchmarks/dump_c_sources.py: a model named that does not exist is a one-line error (exit 2) before any
file is written; a sample or zoo name resolves to its .onnx file."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import dump_c_sources  # noqa: E402


def test_missing_model_is_one_line_error(tmp_path, capsys):
    out = tmp_path / "out"
    assert dump_c_sources.main([str(out), "--devices", "host", "--policies", "unfused", "no_such_model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no model 'no_such_model'") and "\n" not in err
    assert not out.exists() or not any(out.iterdir())


def test_names_resolve_to_sample_and_zoo_files():
    assert dump_c_sources.resolve_model(Path("efficientnet")) == ROOT / "samples" / "zoo" / "efficientnet.onnx"
    assert dump_c_sources.resolve_model(Path("bert_layer")) == ROOT / "samples" / "bert_layer.onnx"
    given = ROOT / "samples" / "zoo" / "nerf.onnx"
    assert dump_c_sources.resolve_model(given) == given
    assert dump_c_sources.resolve_model(Path("nerf.txt")) is None
