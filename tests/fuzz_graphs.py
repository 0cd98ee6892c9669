"""Hypothesis strategy for random valid ONNX models (opset 17, float32, small shapes): a chain or DAG of
2-6 ops over elementwise/broadcast, reductions, softmax, layernorm, matmul/gemm, conv, layout ops and
gathers. `onnx_models()` draws (model, inputs, ops); every model passes check_model and strict shape
inference."""

from __future__ import annotations

import math

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

MAX_ELEMS = 1024  # per tensor: keeps each example's compiles and emulation fast
OPS = ("unary", "exp", "binary_const", "div", "binary_pair", "reduce", "softmax", "layernorm", "matmul",
       "gemm", "conv", "transpose", "reshape", "slice", "concat", "gather")


def _signed(rng: np.random.Generator, shape, lo: float = 0.5, hi: float = 1.5) -> np.ndarray:
    # Magnitudes in [lo, hi] with random signs: never zero, so unwritten outputs show.
    return (rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


class _Builder:
    def __init__(self, draw, rng: np.random.Generator) -> None:
        self.draw, self.rng = draw, rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.tensors: list[tuple[str, tuple[int, ...]]] = []  # every value so far: (name, shape)
        self.ops: list[str] = []

    def weight(self, value: np.ndarray) -> str:
        name = f"w{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs) -> str:
        out = f"t{len(self.nodes)}_{op.lower()}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"n{len(self.nodes)}_{op}", **attrs))
        self.tensors.append((out, tuple(shape)))
        self.ops.append(op)
        return out

    def axis(self, rank: int) -> int:
        a = self.draw(st.integers(0, rank - 1))
        return a - rank if self.draw(st.booleans()) else a  # negative axes too


def _fits(shape) -> bool:
    return 0 < math.prod(shape) <= MAX_ELEMS and all(d >= 1 for d in shape)


def _broadcasts(small, shape) -> bool:
    """Whether `small` broadcasts to `shape` (right-aligned, each dim equal or 1)."""
    return len(small) <= len(shape) and all(a in (1, b) for a, b in zip(small[::-1], shape[::-1]))


def _add_op(b: _Builder, kind: str, x: str, shape: tuple[int, ...]) -> bool:
    """Append one op of `kind` reading `x`; False when it does not apply to this shape."""
    draw, rng, rank = b.draw, b.rng, len(shape)
    if rank == 0 and kind not in ("unary", "exp", "binary_const", "div", "binary_pair", "reshape"):
        return False
    if kind == "unary":
        b.node(draw(st.sampled_from(["Relu", "Sigmoid", "Tanh"])), [x], shape)
    elif kind == "exp":  # Exp of a bounded value (Tanh first) stays finite
        b.node("Exp", [b.node("Tanh", [x], shape)], shape)
    elif kind in ("binary_const", "div"):
        keep = draw(st.integers(0, rank))  # the constant drops leading axes and broadcasts some others
        cshape = tuple(d if draw(st.booleans()) else 1 for d in shape[rank - keep:])
        if kind == "div":
            b.node("Div", [x, b.weight(rng.uniform(0.5, 1.5, cshape).astype(np.float32))], shape)
        else:
            op = draw(st.sampled_from(["Add", "Mul", "Sub"]))
            w = b.weight(_signed(rng, cshape))
            b.node(op, [w, x] if draw(st.booleans()) else [x, w], shape)
    elif kind == "binary_pair":  # joins two branches (the DAG case), e.g. x - ReduceMax(x, keepdims=1)
        same = [n for n, s in b.tensors if n != x and _broadcasts(s, shape)]
        if not same:
            return False
        y = draw(st.sampled_from(same))
        b.node(draw(st.sampled_from(["Add", "Mul", "Sub"])), [y, x] if draw(st.booleans()) else [x, y], shape)
    elif kind == "reduce":
        axes = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank)))
        keep = draw(st.booleans())  # keepdims=0 over every axis: a rank-0 result
        out = tuple(1 if k in axes else d for k, d in enumerate(shape)) if keep else \
            tuple(d for k, d in enumerate(shape) if k not in axes)
        op = draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax"]))
        axes = [a - rank if draw(st.booleans()) else a for a in axes]
        if op == "ReduceSum":  # opset 13+: axes is an input
            b.node(op, [x, b.weight(np.asarray(axes, np.int64))], out, keepdims=int(keep))
        else:
            b.node(op, [x], out, axes=axes, keepdims=int(keep))
    elif kind == "softmax":
        b.node("Softmax", [x], shape, axis=b.axis(rank))
    elif kind == "layernorm":
        d = shape[-1]
        b.node("LayerNormalization", [x, b.weight(_signed(rng, (d,))), b.weight(_signed(rng, (d,), 0.1, 0.5))],
               shape, axis=-1, epsilon=1e-5)
    elif kind == "matmul":
        if rank < 2:
            return False
        n = draw(st.integers(1, 12))
        out = shape[:-1] + (n,)
        if not _fits(out):
            return False
        w = _signed(rng, (shape[-1], n)) / np.float32(shape[-1] ** 0.5)
        b.node("MatMul", [x, b.weight(w)], out)
    elif kind == "gemm":
        if rank != 2:
            return False
        n, trans_a, trans_b = draw(st.integers(1, 12)), draw(st.booleans()), draw(st.booleans())
        rows, k = shape[::-1] if trans_a else shape
        if not _fits((rows, n)):
            return False
        w = _signed(rng, (n, k) if trans_b else (k, n)) / np.float32(k ** 0.5)
        bias = _signed(rng, draw(st.sampled_from([(n,), (1, n), (rows, n)])))
        b.node("Gemm", [x, b.weight(w), b.weight(bias)], (rows, n), transA=int(trans_a), transB=int(trans_b),
               alpha=draw(st.sampled_from([1.0, 0.5])), beta=draw(st.sampled_from([1.0, 2.0])))
    elif kind == "conv":
        if rank != 4:
            return False
        n, c, h, w_ = shape
        k = draw(st.integers(1, 3))
        stride, dil = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        pads = draw(st.lists(st.integers(0, 1), min_size=4, max_size=4))  # [top, left, bottom, right]
        span = dil * (k - 1) + 1
        oh = (h + pads[0] + pads[2] - span) // stride + 1
        ow = (w_ + pads[1] + pads[3] - span) // stride + 1
        depthwise = c > 1 and draw(st.booleans())
        m = c if depthwise else draw(st.integers(1, 8))
        if oh < 1 or ow < 1 or not _fits((n, m, oh, ow)):
            return False
        weight = _signed(rng, (m, 1 if depthwise else c, k, k)) / np.float32((k * k * (1 if depthwise else c)) ** 0.5)
        inputs = [x, b.weight(weight)] + ([b.weight(_signed(rng, (m,), 0.1, 0.5))] if draw(st.booleans()) else [])
        b.node("Conv", inputs, (n, m, oh, ow), kernel_shape=[k, k], strides=[stride, stride],
               dilations=[dil, dil], pads=pads, group=c if depthwise else 1)
    elif kind == "transpose":
        if rank < 2:
            return False
        perm = draw(st.permutations(range(rank)))
        b.node("Transpose", [x], tuple(shape[p] for p in perm), perm=list(perm))
    elif kind == "reshape":
        rem, out = math.prod(shape), []
        for _ in range(draw(st.integers(1, 3)) - 1):
            out.append(draw(st.sampled_from([d for d in range(1, rem + 1) if rem % d == 0])))
            rem //= out[-1]
        out = tuple(out) + (rem,)
        spec = list(out)
        if draw(st.booleans()):
            spec[draw(st.integers(0, len(spec) - 1))] = -1
        b.node("Reshape", [x, b.weight(np.asarray(spec, np.int64))], out)
    elif kind == "slice":
        ax = draw(st.integers(0, rank - 1))
        d = shape[ax]
        if d < 2:
            return False
        start = draw(st.integers(0, d - 1))
        step = draw(st.sampled_from([1, 2, -1, -2]))
        if step > 0:
            end = draw(st.integers(start + 1, d))
        else:  # backwards: end -d-1 (or below) reaches element 0
            end = draw(st.integers(-1, start - 1))
        length = len(range(start, end, step))
        end = -d - 1 if end == -1 else end
        out = shape[:ax] + (length,) + shape[ax + 1:]
        b.node("Slice", [x, b.weight(np.asarray([start], np.int64)), b.weight(np.asarray([end], np.int64)),
                         b.weight(np.asarray([ax - rank if draw(st.booleans()) else ax], np.int64)),
                         b.weight(np.asarray([step], np.int64))], out)
    elif kind == "concat":
        ax = draw(st.integers(0, rank - 1))
        extra = draw(st.integers(1, 3))
        other_shape = shape[:ax] + (extra,) + shape[ax + 1:]
        out = shape[:ax] + (shape[ax] + extra,) + shape[ax + 1:]
        if not _fits(out):
            return False
        other = b.weight(_signed(rng, other_shape))
        b.node("Concat", [other, x] if draw(st.booleans()) else [x, other], out, axis=ax)
    elif kind == "gather":
        ax = draw(st.integers(0, rank - 1))
        d = shape[ax]
        scalar = draw(st.booleans())  # a scalar index on a rank-1 value: a rank-0 result
        count = 1 if scalar else draw(st.integers(1, 4))
        idx = rng.integers(-d, d, count).astype(np.int64)
        out = shape[:ax] + (() if scalar else (count,)) + shape[ax + 1:]
        if not _fits(out):
            return False
        b.node("Gather", [x, b.weight(idx[0] if scalar else idx)], out, axis=ax)
    else:
        raise AssertionError(kind)
    return True


@st.composite
def onnx_models(draw):
    """(model, inputs, op list): a random valid float32 model with one input `x`, its last value as output
    and sometimes an intermediate as a second output."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    rank = draw(st.sampled_from([1, 2, 2, 3, 4, 4]))
    # small dims, and a few past a warp or a tile so that tails show
    shape = list(draw(st.lists(st.integers(1, 8) | st.sampled_from([13, 17, 33, 65]), min_size=rank,
                               max_size=rank)))
    while not _fits(shape):
        k = shape.index(max(shape))
        shape[k] = (shape[k] + 1) // 2
    shape = tuple(shape)
    b = _Builder(draw, rng)
    b.tensors.append(("x", shape))
    n_ops = draw(st.integers(2, 6))
    if rank == 4 and draw(st.booleans()):
        _add_op(b, "conv", "x", shape)  # NCHW inputs start with a Conv half the time: Conv needs rank 4
    for _ in range(n_ops - len(b.ops)):
        # mostly extend the chain; sometimes branch off an earlier value
        x, xshape = b.tensors[-1] if draw(st.integers(0, 3)) else draw(st.sampled_from(b.tensors))
        if not any(_add_op(b, draw(st.sampled_from(OPS)), x, xshape) for _ in range(4)):
            b.node("Relu", [x], xshape)
    outputs = [b.tensors[-1]]
    if len(b.tensors) > 2 and draw(st.booleans()):  # an intermediate a fused kernel must still write out
        outputs.append(draw(st.sampled_from(b.tensors[1:-1])))
    graph = helper.make_graph(
        b.nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    for out, (_, want) in zip(inferred.graph.output, outputs):
        got = tuple(d.dim_value for d in out.type.tensor_type.shape.dim)
        assert got == want, (out.name, got, want)
    return model, {"x": _signed(rng, shape)}, b.ops
