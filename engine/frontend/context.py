"""What a converter sees: the specs and constant values of the values around one ONNX node, and a
place to emit primitive stages (or constant results). Converters live in `engine/frontend/ops/`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.errors import ModelError, UnsupportedOpError
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, Stage, StageKind, TensorSpec


@dataclass(frozen=True)
class OnnxNode:
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]  # "" marks an omitted optional input
    outputs: tuple[str, ...]
    attrs: dict = field(compare=False, hash=False)
    # A node of an ONNX function's body (engine/frontend/functions.py): the opset the body is written for (0: the
    # model's) and the function op it stands in for.
    opset: int = field(default=0, compare=False)
    within: str = field(default="", compare=False)


Converter = Callable[["LowerCtx", OnnxNode], None]
CONST_MAX_ELEMENTS = 1 << 28  # 1 GiB of float32: the largest constant an op may build at import
CONVERTERS: dict[str, Converter] = {}


def register(*op_types: str):
    """Decorator: register a converter for one or more ONNX op types (default domain)."""

    def deco(fn: Converter) -> Converter:
        for op in op_types:
            CONVERTERS[op] = fn
        return fn

    return deco


class LowerCtx:
    """Mutable state of one lowering walk. Values are known by spec; constants also by value."""

    def __init__(self, opset: int):
        self.opset = opset
        self.specs: dict[str, TensorSpec] = {}
        self.consts: dict[str, np.ndarray] = {}
        self.aliases: dict[str, str] = {}
        self.stages: list[Stage] = []
        self._names: set[str] = set()
        self.node: OnnxNode | None = None
        # What a converter learned about a value that a later one may use (MaxPool's Indices: the window they
        # index, so MaxUnpool searches only the inputs whose windows cover an output).
        self.facts: dict = {}

    # ---- lookups ------------------------------------------------------------------------
    def resolve(self, name: str) -> str:
        while name in self.aliases:
            name = self.aliases[name]
        return name

    def spec(self, name: str) -> TensorSpec:
        return self.specs[self.resolve(name)]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.spec(name).shape

    def dtype(self, name: str) -> DType:
        return self.spec(name).dtype

    def const(self, name: str) -> np.ndarray | None:
        """The value when `name` is a known constant (initializer or folded), else None."""
        return self.consts.get(self.resolve(name))

    def require_const(self, name: str, what: str) -> np.ndarray:
        value = self.const(name)
        if value is None:
            node = self.node
            raise UnsupportedOpError(
                f"{node.op_type} node '{node.name}': {what} ('{name}') must be a constant or computable "
                "from shapes at import",
                hint="tileweave compiles static shapes; fold it or bind input shapes with --shape",
            )
        return value

    def has(self, node: OnnxNode, k: int) -> bool:
        return len(node.inputs) > k and node.inputs[k] != ""

    def attr(self, node: OnnxNode, name: str, default=None):
        return node.attrs.get(name, default)

    def check_const_size(self, node: OnnxNode, shape, dtype) -> None:
        """Refuse a constant an op would materialise at import (ConstantOfShape, Range) past
        CONST_MAX_ELEMENTS, before allocating it."""
        count = math.prod(int(d) for d in shape)
        if any(int(d) < 0 for d in shape):
            raise ModelError(f"{node.op_type} node '{node.name}': negative dimension in shape {list(shape)}")
        if count > CONST_MAX_ELEMENTS:
            nbytes = count * np.dtype(dtype).itemsize
            raise ModelError(f"{node.op_type} node '{node.name}' would build a constant of {count:,} elements "
                             f"({nbytes / 2**30:,.1f} GiB) at import, over the memory budget for constants "
                             f"({CONST_MAX_ELEMENTS:,} elements)", hint="make the shape smaller")

    def axis(self, node: OnnxNode, rank: int, default: int | None = None, name: str = "axis") -> int:
        """The attribute `name` as an axis in [0, rank); ModelError when outside ONNX's [-rank, rank)."""
        value = node.attrs.get(name, default)
        if value is None:
            raise ModelError(f"{node.op_type} node '{node.name}' has no '{name}' attribute",
                             hint="add it; onnx.checker lists the op's required attributes")
        value = int(value)
        if not -rank <= value < max(rank, 1):
            raise ModelError(f"{node.op_type} node '{node.name}': {name}={value} is out of range for a rank-{rank} "
                             f"input (allowed {-rank}..{rank - 1})", hint=f"fix the '{name}' attribute")
        return value % rank if rank else 0

    def unsupported(self, what: str) -> UnsupportedOpError:
        node = self.node
        return UnsupportedOpError(
            f"{node.op_type} node '{node.name}': {what} is not supported",
            hint="see docs/onnx-conformance.md for what each op supports",
        )

    # ---- results ------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name = base
        k = 1
        while name in self._names or name in self.specs:
            k += 1
            name = f"{base}.{k}"
        self._names.add(name)
        return name

    def set_const(self, name: str, value: np.ndarray, dtype: DType | None = None) -> None:
        value = np.asarray(value)
        if dtype is not None:
            value = value.astype(dtype.np)
        spec = TensorSpec(name, tuple(int(d) for d in value.shape), DType.from_np(value.dtype))
        self.specs[name] = spec
        self.consts[name] = value
        self._names.add(name)

    def set_alias(self, name: str, target: str) -> None:
        self.aliases[name] = self.resolve(target)

    def emit(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: DType,
        body: E.Expr,
        *,
        kind: StageKind,
        op: str,
        reduce: tuple[int, ...] = (),
        combine: Combine | None = None,
    ) -> str:
        """Add a stage computing `name`. Intermediate stages of a composite use `self.tmp(...)`."""
        stage = Stage(
            name=name, kind=kind, shape=tuple(int(d) for d in shape), dtype=dtype, body=body,
            reduce=tuple(int(r) for r in reduce), combine=combine, op=op,
            origin=(self.node.name,) if self.node else (),
        )
        self.stages.append(stage)
        self.specs[name] = stage.spec
        self._names.add(name)
        return name

    def tmp(self, out: str, suffix: str) -> str:
        """A fresh name for an intermediate stage of the node producing `out`."""
        return self.fresh(f"{out}::{suffix}")

    # ---- body helpers -------------------------------------------------------------------
    def load(self, name: str, index: tuple[I.Lin, ...], pad=None) -> E.Expr:
        """Load `name` at `index`; a one-element constant becomes an immediate."""
        name = self.resolve(name)
        spec = self.specs[name]
        value = self.consts.get(name)
        if value is not None and value.size == 1 and pad is None:
            return E.imm(value.reshape(()).item(), spec.dtype)
        return E.Load(name, tuple(index), spec.dtype, pad)

    def bload(self, name: str, out_shape: tuple[int, ...]) -> E.Expr:
        """Load with NumPy broadcasting of `name` against an output of `out_shape`."""
        shape = self.shape(name)
        if len(shape) > len(out_shape):
            raise self.unsupported(f"broadcast of {shape} to {out_shape}")
        ivars = I.out_vars(len(out_shape))
        offset = len(out_shape) - len(shape)
        index = []
        for k, d in enumerate(shape):
            od = out_shape[offset + k]
            if d == od:
                index.append(ivars[offset + k])
            elif d == 1:
                index.append(I.const(0))
            else:
                raise self.unsupported(f"broadcast of shape {shape} to {out_shape}")
        return self.load(name, tuple(index))

    def elementwise(self, out: str, shape, dtype: DType, body: E.Expr, op: str) -> str:
        return self.emit(out, shape, dtype, body, kind=StageKind.ELEMENTWISE, op=op)


def zero_of(dtype: DType) -> bool | float | int:
    """`dtype`'s zero as a Python value: what a padded load reads outside its tensor, a select's empty arm."""
    return False if dtype == DType.BOOL else (0.0 if dtype.is_float else 0)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy's broadcasting rule in Python ints (np.broadcast_shapes refuses dims past 2**63 / array size)."""
    from engine.errors import ShapeError

    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dims = {int(s[len(s) - rank + k]) for s in shapes if len(s) - rank + k >= 0} - {1}
        if len(dims) > 1:
            raise ShapeError(f"shapes {' and '.join(map(str, shapes))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)
