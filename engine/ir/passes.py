"""Passes on the primitive graph, each PrimGraph -> PrimGraph: constant folding, inlining of pure
index remaps (reshape/transpose views) into their consumers, common-subexpression elimination and
dead-stage removal."""

from __future__ import annotations

import dataclasses

import numpy as np

from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.graph import PrimGraph, Stage, StageKind

FOLD_MAX_ELEMENTS = 1 << 20


def run_default_passes(g: PrimGraph) -> PrimGraph:
    g = fold_constants(g)
    g = inline_views(g)
    g = eliminate_common(g)
    return remove_dead(g)


def remove_dead(g: PrimGraph) -> PrimGraph:
    """Drop stages no output depends on, and constants no stage reads."""
    live = set(g.outputs)
    keep: list[Stage] = []
    for s in reversed(g.stages):
        if s.name in live:
            keep.append(s)
            live.update(s.inputs)
    keep.reverse()
    used = {t for s in keep for t in s.inputs} | set(g.outputs)
    consts = tuple(c for c in g.constants if c.name in used)
    return dataclasses.replace(
        g, stages=tuple(keep), constants=consts, weights={c.name: g.weights[c.name] for c in consts}
    )


def fold_constants(g: PrimGraph) -> PrimGraph:
    """Evaluate stages whose inputs are all constants (small results only) into new constants."""
    from engine.ir.graph import TensorSpec
    from engine.runtime.reference import eval_stage

    weights = dict(g.weights)
    consts = list(g.constants)
    stages: list[Stage] = []
    outputs = set(g.outputs)
    for s in g.stages:
        in_elems = sum(weights[t].size for t in s.inputs if t in weights)
        foldable = s.inputs and all(t in weights for t in s.inputs)
        if s.name not in outputs and foldable and s.size <= max(FOLD_MAX_ELEMENTS, in_elems):
            weights[s.name] = np.ascontiguousarray(eval_stage(s, weights))
            consts.append(TensorSpec(s.name, s.shape, s.dtype))
        else:
            stages.append(s)
    if len(stages) == len(g.stages):
        return g
    return dataclasses.replace(g, stages=tuple(stages), constants=tuple(consts), weights=weights)


def rename_inputs(s: Stage, mapping: dict[str, str]) -> Stage:
    """The same stage reading mapping[t] wherever it read t."""
    if not any(t in mapping for t in s.inputs):
        return s

    def fix_index(ix: tuple[I.Lin, ...]) -> tuple[I.Lin, ...]:
        out = ix
        for old, new in mapping.items():
            out = tuple(I.rename_tensor(e, old, new) for e in out)
        return out

    def fn(node: E.Expr) -> E.Expr:
        if isinstance(node, E.Load):
            return E.Load(mapping.get(node.tensor, node.tensor), fix_index(node.index), node.dtype, node.pad)
        if isinstance(node, E.IndexVal):
            return E.IndexVal(fix_index((node.expr,))[0], node.dtype)
        return node

    return dataclasses.replace(s, body=E.map_expr(s.body, fn))


def eliminate_common(g: PrimGraph) -> PrimGraph:
    """Merge stages computing the same expression over the same inputs (keeps the first)."""
    seen: dict[tuple, str] = {}
    mapping: dict[str, str] = {}
    stages: list[Stage] = []
    outputs = set(g.outputs)
    for s in g.stages:
        s = rename_inputs(s, mapping)
        key = (s.kind, s.shape, s.dtype, s.body, s.reduce, s.combine)
        if key in seen and s.name not in outputs:
            mapping[s.name] = seen[key]
            continue
        seen.setdefault(key, s.name)
        stages.append(s)
    if not mapping:
        return g
    return dataclasses.replace(g, stages=tuple(stages))


def _ranges(s: Stage) -> dict[str, tuple[int, int]]:
    r = {f"i{k}": (0, n - 1) for k, n in enumerate(s.shape)}
    r.update({f"r{k}": (0, n - 1) for k, n in enumerate(s.reduce)})
    return r


def _view_of(s: Stage) -> E.Load | None:
    """The single load of a pure index-remap stage (reshape, transpose, squeeze, slice), or None."""
    if s.kind != StageKind.LAYOUT or not isinstance(s.body, E.Load) or s.body.pad is not None:
        return None
    if any(ix.indirect_tensors() for ix in s.body.index):
        return None
    return s.body


def inline_views(g: PrimGraph) -> PrimGraph:
    """Substitute view stages into consumers when the composed index stays free of div/mod: the
    reshape/transpose in front of a matmul becomes a strided load instead of a copy kernel."""
    views = {s.name: v for s in g.stages if (v := _view_of(s)) is not None and s.name not in g.outputs}
    if not views:
        return g
    stages: list[Stage] = []
    for s in g.stages:
        if s.name in views:
            s = _inline_into(s, views)  # views of views compose too
            v = _view_of(s)
            if v is not None:
                views[s.name] = v
        else:
            s = _inline_into(s, views)
        stages.append(s)
    return remove_dead(dataclasses.replace(g, stages=tuple(stages)))


def _inline_into(s: Stage, views: dict[str, E.Load]) -> Stage:
    if not any(t in views for t in s.inputs):
        return s
    ranges = _ranges(s)
    indirect_users = {t for node in E.walk(s.body) if isinstance(node, E.Load)
                      for ix in node.index for t in ix.indirect_tensors()}

    def fn(node: E.Expr) -> E.Expr:
        if not isinstance(node, E.Load) or node.tensor not in views or node.tensor in indirect_users:
            return node
        if node.pad is not None:
            return node  # padding applies to the view's bounds, not its source's: keep the copy
        view = views[node.tensor]
        mapping = {f"i{k}": e for k, e in enumerate(node.index)}
        composed = tuple(I.simplify(I.substitute(e, mapping), ranges) for e in view.index)
        if not all(_no_divmod(e) for e in composed):
            return node
        return E.Load(view.tensor, composed, node.dtype, node.pad)

    return dataclasses.replace(s, body=E.map_expr(s.body, fn))


def _no_divmod(e: I.Lin) -> bool:
    return all(not isinstance(a, (I.FloorDiv, I.Mod)) for a, _ in e.terms)
