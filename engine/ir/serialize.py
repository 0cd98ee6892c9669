"""JSON round trip for the IR: index expressions, bodies, stages and graphs.

Nodes become `{"t": TypeName, ...fields}`; weights travel separately (npz) since they are bulk data.
"""

from __future__ import annotations

import dataclasses
from enum import Enum

import numpy as np

from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, PrimGraph, Stage, StageKind, TensorSpec

_NODE_TYPES = {
    cls.__name__: cls
    for cls in (
        I.Var, I.FloorDiv, I.Mod, I.Min, I.Max, I.Abs, I.Indirect, I.Lin,
        E.Load, E.Imm, E.IndexVal, E.Unary, E.Binary, E.Select, E.Cast,
    )
}
_ENUMS = {"dtype": DType, "kind": StageKind, "combine": Combine}


def to_obj(x):
    if isinstance(x, I.Lin):
        return {"t": "Lin", "terms": [[to_obj(a), k] for a, k in x.terms], "const": x.const}
    if dataclasses.is_dataclass(x) and type(x).__name__ in _NODE_TYPES:
        out = {"t": type(x).__name__}
        for f in dataclasses.fields(x):
            out[f.name] = to_obj(getattr(x, f.name))
        return out
    if isinstance(x, Enum):
        return x.value
    if isinstance(x, tuple):
        return [to_obj(v) for v in x]
    if isinstance(x, float) and not np.isfinite(x):
        return {"t": "float", "v": repr(x)}
    return x


def from_obj(o):
    if isinstance(o, dict):
        t = o["t"]
        if t == "float":
            return float(o["v"])
        if t == "Lin":
            return I.Lin(tuple((from_obj(a), int(k)) for a, k in o["terms"]), int(o["const"]))
        cls = _NODE_TYPES[t]
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in o:
                continue
            v = o[f.name]
            if f.name in _ENUMS and v is not None:
                kwargs[f.name] = _ENUMS[f.name](v)
            else:
                kwargs[f.name] = _tuplify(from_obj(v))
        return cls(**kwargs)
    if isinstance(o, list):
        return tuple(from_obj(v) for v in o)
    return o


def _tuplify(v):
    return tuple(v) if isinstance(v, list) else v


def stage_to_json(s: Stage) -> dict:
    return {
        "name": s.name, "kind": s.kind.value, "shape": list(s.shape), "dtype": s.dtype.value,
        "body": to_obj(s.body), "reduce": list(s.reduce),
        "combine": s.combine.value if s.combine else None, "op": s.op, "origin": list(s.origin),
    }


def stage_from_json(d: dict) -> Stage:
    return Stage(
        name=d["name"], kind=StageKind(d["kind"]), shape=tuple(d["shape"]), dtype=DType(d["dtype"]),
        body=from_obj(d["body"]), reduce=tuple(d["reduce"]),
        combine=Combine(d["combine"]) if d["combine"] else None, op=d["op"], origin=tuple(d["origin"]),
    )


def _spec(t: TensorSpec) -> dict:
    return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype.value}


def _unspec(d: dict) -> TensorSpec:
    return TensorSpec(d["name"], tuple(d["shape"]), DType(d["dtype"]))


def graph_to_json(g: PrimGraph, *, weights: bool = False) -> dict:
    out = {
        "name": g.name,
        "inputs": [_spec(t) for t in g.inputs],
        "constants": [_spec(t) for t in g.constants],
        "stages": [stage_to_json(s) for s in g.stages],
        "outputs": list(g.outputs),
        "output_names": list(g.output_names),
    }
    if weights:
        out["weights"] = {k: {"dtype": str(v.dtype), "shape": list(v.shape), "data": v.ravel().tolist()}
                          for k, v in g.weights.items()}
    return out


def graph_from_json(d: dict, weights: dict[str, np.ndarray] | None = None) -> PrimGraph:
    if weights is None and "weights" in d:
        weights = {k: np.array(v["data"], dtype=v["dtype"]).reshape(v["shape"]) for k, v in d["weights"].items()}
    return PrimGraph(
        name=d["name"],
        inputs=tuple(_unspec(t) for t in d["inputs"]),
        constants=tuple(_unspec(t) for t in d["constants"]),
        stages=tuple(stage_from_json(s) for s in d["stages"]),
        outputs=tuple(d["outputs"]),
        weights=weights or {},
        output_names=tuple(d.get("output_names") or d["outputs"]),
    )
