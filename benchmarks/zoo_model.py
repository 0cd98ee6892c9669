"""The model a benchmark script is given: a zoo name (samples/zoo/NAME.onnx) or an .onnx path; a name or path
that is no file ends the script with one line."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def zoo_model(arg: str) -> Path:
    model = Path(arg) if arg.endswith(".onnx") else ROOT / "samples" / "zoo" / f"{arg}.onnx"
    if not model.is_file():
        sys.exit(f"error: no model {model} (give a zoo name or an .onnx path)")
    return model
