"""The primitive graph: stages, each `out[i...] = combine over r... of body`, plus graph inputs,
constant tensors (weights) and outputs. Stages are kept in topological order."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import numpy as np

from engine.ir.dtypes import DType
from engine.ir.expr import Expr, count_flops, tensors_read


class StageKind(StrEnum):
    ELEMENTWISE = "elementwise"
    REDUCE = "reduce"
    CONTRACTION = "contraction"  # matmul/conv: compute-intensive reduce over a product
    LAYOUT = "layout"  # pure index remap: transpose, reshape, slice, concat, pad, gather


class Combine(StrEnum):
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"
    ARGMAX = "argmax"  # index along r0 of the first maximum of the body
    ARGMIN = "argmin"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: DType

    @property
    def size(self) -> int:
        return math.prod(int(d) for d in self.shape)  # Python ints: a hostile shape must not wrap around

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


@dataclass(frozen=True)
class Stage:
    """One tensor computed by a tensor expression. Output axes are i0..i{rank-1}, reduce axes
    r0..r{len(reduce)-1} with extents `reduce`."""

    name: str
    kind: StageKind
    shape: tuple[int, ...]
    dtype: DType
    body: Expr
    reduce: tuple[int, ...] = ()
    combine: Combine | None = None
    op: str = ""  # short label used to name kernels ("matmul", "add", "softmax.max")
    origin: tuple[str, ...] = ()  # ONNX node names this stage came from

    def __post_init__(self):
        if bool(self.reduce) != (self.combine is not None):
            raise ValueError(f"stage {self.name}: reduce axes and combine go together")
        if self.kind in (StageKind.REDUCE, StageKind.CONTRACTION) and not self.reduce:
            raise ValueError(f"stage {self.name}: {self.kind.value} needs reduce axes")
        if self.kind in (StageKind.ELEMENTWISE, StageKind.LAYOUT) and self.reduce:
            raise ValueError(f"stage {self.name}: {self.kind.value} has no reduce axes")

    @cached_property
    def inputs(self) -> tuple[str, ...]:
        return tensors_read(self.body)

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.shape, self.dtype)

    @cached_property
    def size(self) -> int:
        return math.prod(self.shape)

    @cached_property
    def reduce_size(self) -> int:
        return math.prod(self.reduce)

    @cached_property
    def point_flops(self) -> int:
        """Arithmetic operations of one evaluation of the body plus the combine."""
        return count_flops(self.body) + (1 if self.reduce else 0)

    @cached_property
    def flops(self) -> int:
        """Arithmetic operations to compute the whole tensor once (body per point + combine)."""
        return self.size * self.reduce_size * self.point_flops

    @property
    def is_memory_intensive(self) -> bool:
        return self.kind != StageKind.CONTRACTION


@dataclass(frozen=True)
class PrimGraph:
    """Primitive stages in topological order. `weights` holds the constant tensors' values; it is
    excluded from equality and hashed by content in `structural_hash`."""

    name: str
    inputs: tuple[TensorSpec, ...]
    constants: tuple[TensorSpec, ...]
    stages: tuple[Stage, ...]
    outputs: tuple[str, ...]
    weights: Mapping[str, np.ndarray] = field(default_factory=dict, compare=False, hash=False, repr=False)
    # ONNX names of graph outputs in order -> tensor names (usually identical).
    output_names: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.output_names:
            object.__setattr__(self, "output_names", self.outputs)

    # ---- lookups ------------------------------------------------------------------------
    @cached_property
    def stage_map(self) -> dict[str, Stage]:
        return {s.name: s for s in self.stages}

    @cached_property
    def specs(self) -> dict[str, TensorSpec]:
        out = {t.name: t for t in self.inputs}
        out.update({t.name: t for t in self.constants})
        out.update({s.name: s.spec for s in self.stages})
        return out

    def stage(self, name: str) -> Stage:
        return self.stage_map[name]

    def is_stage(self, name: str) -> bool:
        return name in self.stage_map

    @cached_property
    def consumers(self) -> dict[str, tuple[str, ...]]:
        """tensor name -> names of stages reading it (in stage order)."""
        acc: dict[str, list[str]] = {}
        for s in self.stages:
            for t in s.inputs:
                acc.setdefault(t, []).append(s.name)
        return {k: tuple(v) for k, v in acc.items()}

    @cached_property
    def edges(self) -> tuple[tuple[str, str], ...]:
        """Stage-to-stage edges (producer, consumer) in a stable order."""
        out = []
        for s in self.stages:
            for t in s.inputs:
                if t in self.stage_map:
                    out.append((t, s.name))
        return tuple(out)

    # ---- totals -------------------------------------------------------------------------
    @property
    def flops(self) -> int:
        return sum(s.flops for s in self.stages)

    @cached_property
    def total_bytes(self) -> int:
        """Every tensor at once: inputs, weights, intermediates and outputs (what a cache must hold to keep
        the whole model resident)."""
        return sum(t.nbytes for t in self.specs.values())

    @property
    def param_bytes(self) -> int:
        return sum(t.nbytes for t in self.constants)

    @property
    def min_dram_bytes(self) -> int:
        """Inputs + weights read once + outputs written once: the floor for any schedule. A weight read only
        through gathered indices (an embedding table) counts the slices its index tensors can pick at most,
        where that is less than the whole (`gathered_bytes`)."""
        outs = {self.specs[o].name: self.specs[o].nbytes for o in self.outputs}
        weights = sum(min(t.nbytes, self.gathered_bytes.get(t.name, t.nbytes)) for t in self.constants)
        return sum(t.nbytes for t in self.inputs) + weights + sum(outs.values())

    @cached_property
    def gathered_bytes(self) -> dict[str, int]:
        """tensor -> bytes at most read of it, for each tensor every load of which indexes an axis through
        gathered indices (Gather's: `index.Indirect`): per load, as many slices of that axis as its index
        tensors have elements (a 30522-row embedding table read by 128 token ids: 128 rows)."""
        from engine.ir import expr as E

        found: dict[str, int] = {}
        whole: set[str] = set()
        for st in self.stages:
            for node in E.walk(st.body):
                if not isinstance(node, E.Load) or node.tensor not in self.specs:
                    continue
                spec = self.specs[node.tensor]
                picks = [(d, ix.indirect_tensors()) for d, ix in enumerate(node.index) if ix.indirect_tensors()]
                if not picks or any(q not in self.specs for _, qs in picks for q in qs):
                    whole.add(node.tensor)
                    continue
                d, sources = picks[0]
                slices = sum(self.specs[q].size for q in sources)
                found[node.tensor] = found.get(node.tensor, 0) + slices * (spec.nbytes // max(1, spec.shape[d]))
        return {t: b for t, b in found.items() if t not in whole}

    # ---- hashing ------------------------------------------------------------------------
    @cached_property
    def structural_hash(self) -> str:
        """sha256 over stages, specs and weight contents: the model hash plans are tied to."""
        from engine.ir.serialize import graph_to_json

        h = hashlib.sha256(json.dumps(graph_to_json(self, weights=False), sort_keys=True).encode())
        for name in sorted(self.weights):
            arr = np.ascontiguousarray(self.weights[name])
            h.update(name.encode())
            h.update(arr.tobytes())
        return h.hexdigest()[:16]
