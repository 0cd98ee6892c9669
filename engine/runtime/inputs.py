"""Fixed-seed model inputs: `make_inputs(graph, seed)` -> {input name: array}, and the checks that
user-supplied arrays match the model's input specs (name, shape, dtype).

Each input draws from its own generator seeded by (seed, crc32(name)), so supplying some inputs
from a file leaves the generated values of the others unchanged.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

import numpy as np

from engine.errors import ShapeError, TileweaveError
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import PrimGraph, TensorSpec

FLOAT_CLIP = 3.0  # N(0,1) clipped: keeps exp/pow chains finite while staying far from all-zero
INT_HIGH = 10  # integer inputs that index nothing are drawn from [0, INT_HIGH)


def make_inputs(graph_or_specs, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for every graph input.

    Floats ~ N(0, 1) clipped to ±FLOAT_CLIP; integers feeding a Gather in [0, size of the gathered
    axis) (the smallest such size when one input indexes several tensors), other integers in
    [0, INT_HIGH); bools uniform. Accepts a PrimGraph, an import Graph or TensorSpecs (the last two
    carry no Gather information, so their integers use [0, INT_HIGH)).
    """
    specs = _specs_of(graph_or_specs)
    limits = index_limits(graph_or_specs) if isinstance(graph_or_specs, PrimGraph) else {}
    return {s.name: make_input(s, seed, limits.get(s.name)) for s in specs}


def make_input(spec: TensorSpec, seed: int = 0, high: int | None = None) -> np.ndarray:
    """One input: see `make_inputs`; `high` bounds integer values (exclusive)."""
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    if spec.dtype.is_float:
        values = np.clip(rng.standard_normal(spec.shape), -FLOAT_CLIP, FLOAT_CLIP)
        return values.astype(spec.dtype.np)
    if spec.dtype.is_int:
        return rng.integers(0, max(1, high or INT_HIGH), size=spec.shape).astype(spec.dtype.np)
    if spec.dtype == DType.BOOL:
        return rng.random(spec.shape) < 0.5
    raise TypeError(spec.dtype)


def index_limits(graph: PrimGraph) -> dict[str, int]:
    """Input name -> exclusive upper bound of valid values, for inputs used as gather indices."""
    limits: dict[str, int] = {}
    for stage in graph.stages:
        for node in E.walk(stage.body):
            exprs = node.index if isinstance(node, E.Load) else (node.expr,) if isinstance(node, E.IndexVal) else ()
            for e in exprs:
                for atom in _indirect_atoms(e):
                    limits[atom.tensor] = min(limits.get(atom.tensor, atom.size), atom.size)
    return limits


def _indirect_atoms(e: I.Lin) -> Iterable[I.Indirect]:
    for atom, _ in e.terms:
        if isinstance(atom, I.Indirect):
            yield atom
            for sub in atom.index:
                yield from _indirect_atoms(sub)
        elif isinstance(atom, (I.FloorDiv, I.Mod, I.Abs)):
            yield from _indirect_atoms(atom.x)
        elif isinstance(atom, (I.Min, I.Max)):
            yield from _indirect_atoms(atom.a)
            yield from _indirect_atoms(atom.b)


def _specs_of(graph_or_specs) -> tuple[TensorSpec, ...]:
    if hasattr(graph_or_specs, "inputs"):
        return tuple(graph_or_specs.inputs)
    return tuple(graph_or_specs)


def check_inputs(specs: Iterable[TensorSpec], given: Mapping[str, np.ndarray]) -> None:
    """Raise ShapeError when a supplied array has an unknown name, the wrong shape or dtype."""
    by_name = {s.name: s for s in specs}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        raise TileweaveError(f"inputs file has array(s) {', '.join(unknown)} that are not model inputs",
                             hint=f"the model's inputs are: {', '.join(by_name) or '(none)'}")
    for name, arr in given.items():
        spec = by_name[name]
        if tuple(arr.shape) != spec.shape:
            raise ShapeError(f"input '{name}' has shape {_dims(arr.shape)}, expected {_dims(spec.shape)}",
                             hint="fix the array or bind dynamic dims with --shape")
        if arr.dtype != spec.dtype.np:
            raise ShapeError(f"input '{name}' has dtype {arr.dtype}, expected {spec.dtype.value}",
                             hint=f"convert it with arr.astype(np.{spec.dtype.value})")


def complete_inputs(graph: PrimGraph, given: Mapping[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """The supplied arrays (checked against the graph's inputs) plus generated ones for the rest."""
    check_inputs(graph.inputs, given)
    missing = [s for s in graph.inputs if s.name not in given]
    limits = index_limits(graph)
    out = {s.name: make_input(s, seed, limits.get(s.name)) for s in missing}
    out.update({k: np.asarray(v) for k, v in given.items()})
    return {s.name: out[s.name] for s in graph.inputs}


def _dims(shape) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"
