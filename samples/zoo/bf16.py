"""bfloat16 versions of ONNX models, made with onnx alone (fp16.py's converter with another element type):
every float32 initializer, Constant, graph input and output, Cast target and float attribute tensor as
bfloat16 (rounded to nearest even); integer and bool tensors left alone; shapes re-inferred. How the
tensor-core benchmark (--bf16) and tests get bf16 zoo models.

    PYTHONPATH=. python samples/zoo/bf16.py samples/zoo/bert.onnx /tmp/bert.bf16.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp16 import float_inputs, to_float_type  # noqa: E402

BFLOAT16 = onnx.TensorProto.BFLOAT16


def to_bf16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose float32 values are bfloat16 (fp16.to_float_type)."""
    return to_float_type(model, BFLOAT16)


def bf16_inputs(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float32 arrays of `inputs` as bfloat16 (ml_dtypes; others unchanged)."""
    return float_inputs(inputs, ml_dtypes.bfloat16)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: bf16.py IN.onnx OUT.onnx", file=sys.stderr)
        sys.exit(2)
    onnx.save(to_bf16(onnx.load(sys.argv[1])), sys.argv[2])
