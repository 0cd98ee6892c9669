"""fp16 versions of ONNX models, made with onnx alone: a ModelProto in, the same graph with every float32
initializer, Constant, graph input and output, Cast target and float attribute tensor as float16 out (no
new dependency; how the tensor-core benchmark and tests get fp16 zoo models). Integer and bool tensors
are left alone; shapes are re-inferred.

    PYTHONPATH=. python samples/zoo/fp16.py samples/zoo/bert.onnx /tmp/bert.fp16.onnx
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose float32 values are float16: initializers and Constant/ConstantOfShape
    tensors converted (values past fp16's range saturate to its largest finite value, not to inf), Cast
    to float32 and the float outputs of CastLike/RandomX retargeted, graph inputs and outputs retyped;
    the stale intermediate value_info dropped and inferred again."""
    return to_float_type(model, FLOAT16)


def to_float_type(model: onnx.ModelProto, elem: int) -> onnx.ModelProto:
    """`to_fp16` for another float element type `elem` (TensorProto.FLOAT16 or BFLOAT16; samples/zoo/bf16.py):
    values rounded to nearest even, saturating at the type's largest finite value."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == FLOAT:
            g.initializer[i].CopyFrom(_narrow(t, elem))
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FLOAT:
                a.t.CopyFrom(_narrow(a.t, elem))
            elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == FLOAT:
                a.i = elem
        if any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
            raise ValueError(f"node {node.name or node.op_type}: subgraphs are not converted")
    for v in list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type == FLOAT:
            v.type.tensor_type.elem_type = elem
    del g.value_info[:]
    return onnx.shape_inference.infer_shapes(out, strict_mode=True)


def fp16_inputs(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float32 arrays of `inputs` as float16 (others unchanged)."""
    return float_inputs(inputs, np.float16)


def float_inputs(inputs: dict[str, np.ndarray], dtype) -> dict[str, np.ndarray]:
    """The float32 arrays of `inputs` as `dtype` (others unchanged)."""
    return {k: v.astype(dtype) if v.dtype == np.float32 else v for k, v in inputs.items()}


def _narrow(t: onnx.TensorProto, elem: int) -> onnx.TensorProto:
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    a = numpy_helper.to_array(t)
    big = float(ml_dtypes.finfo(dtype).max)
    return numpy_helper.from_array(np.clip(a, -big, big).astype(dtype), t.name)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: fp16.py IN.onnx OUT.onnx", file=sys.stderr)
        sys.exit(2)
    onnx.save(to_fp16(onnx.load(sys.argv[1])), sys.argv[2])
