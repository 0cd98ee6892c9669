"""ONNX file -> Graph (static shapes, folded shape subgraphs) -> PrimGraph (primitive stages).

`import_onnx` loads and checks the model, binds dynamic dimensions, and walks the nodes once with the
converters to infer every shape and fold nodes whose inputs are all constant (Shape/Gather/Concat
chains, initializer casts). `lower` runs the converters over the remaining nodes and applies the
primitive-graph passes.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.errors import ModelError, ShapeError, UnsupportedOpError
from engine.flags import debug
from engine.frontend.context import CONVERTERS, LowerCtx, OnnxNode
from engine.frontend.functions import function_ops, nodes_of, tensor_type
from engine.frontend.schema import check_node_types, check_opset
from engine.ir.dtypes import ONNX_TO_DTYPE, DType
from engine.ir.graph import PrimGraph, StageKind, TensorSpec
from engine.memo import memo

FOLD_MAX_ELEMENTS = 1 << 20  # constant results larger than this stay runtime stages


@dataclass(frozen=True)
class Graph:
    """An ONNX graph after import: static shapes for every value, constants folded."""

    name: str
    opset: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]
    nodes: tuple[OnnxNode, ...]
    specs: dict = field(compare=False, hash=False, repr=False)
    constants: dict = field(compare=False, hash=False, repr=False)
    onnx_ops: dict = field(compare=False, hash=False, default_factory=dict)  # op histogram, pre-folding
    source_hash: str = ""


def supported_ops() -> list[str]:
    """Ops a converter handles, and those without one that ONNX defines by a function (expanded at import:
    engine/frontend/functions.py; they import where their bodies' ops do)."""
    _ensure_ops()
    return sorted(set(CONVERTERS) | set(_function_ops()))


def _function_ops() -> list[str]:
    return memo("importer.function_ops", 4).lookup(len(CONVERTERS), lambda: function_ops(set(CONVERTERS)))


def _ensure_ops() -> None:
    import engine.frontend.ops  # noqa: F401  (registers converters)


# ---- loading --------------------------------------------------------------------------------


def load_model(path: str | os.PathLike):
    """Read, parse and check an ONNX file; external data must stay inside the model's folder."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.exists():
        raise ModelError(f"model file '{path}' does not exist", hint="check the path")
    if path.is_dir():
        raise ModelError(f"'{path}' is a folder, not an ONNX file")
    data = path.read_bytes()
    if not data:
        raise ModelError(f"'{path}' is empty, not an ONNX model")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as err:
        kind = "truncated or corrupt ONNX protobuf" if _looks_like_onnx(data) else "not an ONNX file"
        raise ModelError(f"'{path}' is {kind} ({str(err).splitlines()[0][:120]})",
                         hint="re-export the model") from None
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"'{path}' is not an ONNX model (no graph found)", hint="re-export the model")
    _load_external(model, path.parent.resolve())
    try:
        onnx.checker.check_model(model)
    except Exception as err:  # onnx raises ValidationError and a few others
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise ModelError(f"'{path}' fails onnx.checker: {first}", hint="fix the model or re-export it") from None
    return model


def _looks_like_onnx(data: bytes) -> bool:
    # ModelProto starts with ir_version (field 1, varint): byte 0x08.
    return data[:1] == b"\x08"


def _load_external(model, base: Path) -> None:
    from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_tensor, uses_external_data

    for tensor in _all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = ExternalDataInfo(tensor)
        target = (base / info.location).resolve()
        if os.path.isabs(info.location) or base not in target.parents:
            raise ModelError(
                f"initializer '{tensor.name}' points to external data '{info.location}' outside the "
                f"model's folder {base}",
                hint="refused for safety; move the data file next to the model",
            )
        if not target.exists():
            raise ModelError(f"external data file '{info.location}' for '{tensor.name}' is missing",
                             hint=f"put it in {base}")
        load_external_data_for_tensor(tensor, str(base))
        tensor.data_location = 0
        del tensor.external_data[:]


def _all_tensors(model):
    yield from model.graph.initializer
    for node in model.graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t


# ---- import -------------------------------------------------------------------------------


def import_onnx(source, shapes: dict[str, tuple[int, ...]] | None = None) -> Graph:
    """Load (path or ModelProto), check, bind shapes, infer and fold. Returns a Graph."""
    import onnx
    from onnx import numpy_helper

    _ensure_ops()
    model = load_model(source) if not isinstance(source, onnx.ModelProto) else source
    opset = _default_opset(model)
    g = model.graph
    shapes = dict(shapes or {})

    ctx = LowerCtx(opset)
    init_names = set()
    for t in g.initializer:
        ctx.set_const(t.name, _tensor_value(t, numpy_helper))
        init_names.add(t.name)
    input_names = [vi.name for vi in g.input if vi.name not in init_names]
    if set(shapes) - set(input_names):
        # Checked first: a mistyped name would otherwise surface as "dynamic dimension with no binding".
        raise ShapeError(f"--shape names unknown input(s) {', '.join(sorted(set(shapes) - set(input_names)))}",
                         hint=f"the model's inputs are: {', '.join(input_names)}")
    inputs = []
    for vi in g.input:
        if vi.name in init_names:
            continue
        spec = _input_spec(vi, shapes.pop(vi.name, None))
        ctx.specs[spec.name] = spec
        inputs.append(spec)

    kept: list[OnnxNode] = []
    histogram: Counter = Counter()

    def type_of(value: str):
        return tensor_type(ctx.spec(value).dtype, ctx.spec(value).shape) if ctx.resolve(value) in ctx.specs else None

    def make(proto, k: int, node_opset: int, within: str) -> OnnxNode:
        return _node(proto, k, numpy_helper, 0 if node_opset == opset else node_opset, within)

    for k, proto in enumerate(g.node):
        histogram[proto.op_type] += 1
        for node in nodes_of(proto, k, opset, CONVERTERS, type_of, make):  # a function op: its body's nodes
            if _run_node(ctx, node, fold=True):
                kept.append(node)

    outputs = tuple(o.name for o in g.output)
    for o in outputs:
        if ctx.resolve(o) not in ctx.specs:
            raise ModelError(f"graph output '{o}' is never produced")
    return Graph(
        name=g.name or "model", opset=opset, inputs=tuple(inputs), outputs=outputs, nodes=tuple(kept),
        specs=dict(ctx.specs), constants=dict(ctx.consts), onnx_ops=dict(sorted(histogram.items())),
        source_hash=hashlib.sha256(model.SerializeToString()).hexdigest()[:16],
    )


def lower(graph: Graph, *, passes: bool = True) -> PrimGraph:
    """Run the converters over the graph's nodes, then the primitive-graph passes."""
    from engine.ir.passes import run_default_passes

    _ensure_ops()
    ctx = LowerCtx(graph.opset)
    for name, value in graph.constants.items():
        ctx.set_const(name, value)
    for spec in graph.inputs:
        ctx.specs[spec.name] = spec
    for node in graph.nodes:
        _run_node(ctx, node, fold=False)

    outputs = []
    for o in graph.outputs:
        t = ctx.resolve(o)
        stage_names = {s.name for s in ctx.stages}
        if t not in stage_names:
            # A graph output that is an input or constant still needs a stage that writes it.
            from engine.ir import index as I

            spec = ctx.specs[t]
            name = ctx.fresh(f"{o}::copy")
            body = ctx.load(t, I.out_vars(len(spec.shape))) if t not in ctx.consts or ctx.consts[t].size != 1 \
                else ctx.load(t, tuple(I.const(0) for _ in spec.shape))
            ctx.node = None
            ctx.emit(name, spec.shape, spec.dtype, body, kind=StageKind.LAYOUT, op="copy")
            t = name
        outputs.append(t)

    used = {n for s in ctx.stages for n in s.inputs}
    constants = tuple(TensorSpec(n, ctx.specs[n].shape, ctx.specs[n].dtype) for n in ctx.consts if n in used)
    weights = {c.name: ctx.consts[c.name] for c in constants}
    pg = PrimGraph(
        name=graph.name, inputs=graph.inputs, constants=constants, stages=tuple(ctx.stages),
        outputs=tuple(outputs), weights=weights, output_names=graph.outputs,
    )
    from engine.flags import DEBUG, dump
    from engine.ir.printer import format_graph, graph_to_dot

    if DEBUG >= 5:
        debug(5, "PrimGraph after lowering:\n" + format_graph(pg))
    if passes:
        pg = run_default_passes(pg)
        if DEBUG >= 5:
            debug(5, "PrimGraph after passes (fold, inline views, CSE, dead stages):\n" + format_graph(pg))
    dump("graph.txt", format_graph(pg))
    dump("graph.dot", graph_to_dot(pg))
    return pg


def declared_inputs(path) -> dict[str, tuple[int | None, ...] | None] | None:
    """name -> declared dims (None for a dynamic one; None for no shape) of each graph input of a model file."""
    import onnx

    try:
        model = onnx.load_model_from_string(Path(path).read_bytes())
    except Exception:  # unreadable or not ONNX: import_onnx reports it in one line
        return None
    init = {t.name for t in model.graph.initializer}
    out: dict[str, tuple[int | None, ...] | None] = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        out[vi.name] = (tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                              for d in tt.shape.dim) if tt.HasField("shape") else None)
    return out


def bind_from_arrays(path, shapes: dict[str, tuple[int, ...]] | None, arrays) -> dict[str, tuple[int, ...]]:
    """`shapes` (--shape), and for each graph input with a dynamic dimension they leave unbound whose array
    `arrays` holds (an --inputs file, a model's .io.npz: what it is about to run on), that array's shape,
    where it has the input's rank and its fixed dimensions. bert-base exported with dynamic batch and
    sequence axes then runs on its ids without --shape."""
    out = dict(shapes or {})
    declared = declared_inputs(path) or {}
    for name, dims in declared.items():
        if name in out or name not in arrays or dims is None or None not in dims:
            continue
        shape = tuple(int(n) for n in np.shape(arrays[name]))
        if len(shape) == len(dims) and all(d is None or d == n for d, n in zip(dims, shape)) and all(shape):
            out[name] = shape
    return out


def load_graph(path, shapes: dict[str, tuple[int, ...]] | None = None) -> PrimGraph:
    """import_onnx + lower: the PrimGraph of a model file."""
    return lower(import_onnx(path, shapes))


# ---- helpers --------------------------------------------------------------------------------


def _run_node(ctx: LowerCtx, node: OnnxNode, *, fold: bool) -> bool:
    """Convert one node. With `fold`, evaluate it when all inputs are constant. Returns whether the
    node must stay in the graph (its outputs are not all constants)."""
    if node.domain not in ("", "ai.onnx"):
        raise UnsupportedOpError(
            f"op {node.domain}.{node.op_type} (node '{node.name}') is from a custom domain",
            hint="only the default ONNX domain is supported; see docs/onnx-conformance.md",
        )
    conv = CONVERTERS.get(node.op_type)
    if conv is None:
        within = f" in the body of ONNX function {node.within}" if node.within else ""
        raise UnsupportedOpError(
            f"op {node.op_type} (node '{node.name}'{within}) is not supported",
            hint=f"supported ops are listed in docs/onnx-conformance.md ({len(supported_ops())} ops)",
        )
    for name in node.inputs:
        if name and ctx.resolve(name) not in ctx.specs:
            raise ModelError(f"node '{node.name}' reads '{name}', which nothing produces")
    model_opset = ctx.opset
    ctx.opset = node.opset or model_opset  # a function body's node: the opset its body is written for
    try:
        if fold:  # the import pass: check each node against its schema once, before converting it
            check_node_types(node.op_type, node.domain, node.name, ctx.opset, node.inputs,
                             [ctx.spec(i).dtype if i else None for i in node.inputs])
        ctx.node = node
        first = len(ctx.stages)
        conv(ctx, node)
    finally:
        ctx.opset = model_opset
    new = ctx.stages[first:]
    outs = [o for o in node.outputs if o]
    for o in outs:
        if ctx.resolve(o) not in ctx.specs:
            raise ModelError(f"converter for {node.op_type} did not produce '{o}'")
    all_const_in = all(ctx.const(i) is not None for i in node.inputs if i)
    # Fold unless it would blow a small constant up into a large one (ConstantOfShape, Expand):
    # casts and transposes of weights always fold.
    in_elems = sum(ctx.spec(i).size for i in node.inputs if i)
    small = all(ctx.spec(o).size <= max(FOLD_MAX_ELEMENTS, in_elems) for o in outs)
    if fold and new and all_const_in and small:
        _fold(ctx, new, outs)
    elif not fold:
        return True
    return not all(ctx.const(o) is not None for o in outs)


def _fold(ctx: LowerCtx, new: list, outs: list[str]) -> None:
    from engine.runtime.reference import eval_stage

    env = dict(ctx.consts)
    for s in new:
        env[s.name] = eval_stage(s, env)
    del ctx.stages[len(ctx.stages) - len(new):]
    for o in outs:
        t = ctx.resolve(o)
        if t in env:
            ctx.aliases.pop(o, None)
            ctx.set_const(o, env[t])


def _default_opset(model) -> int:
    return check_opset(next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None))


def _tensor_value(t, numpy_helper) -> np.ndarray:
    if t.data_type not in ONNX_TO_DTYPE:
        import onnx

        name = onnx.TensorProto.DataType.Name(t.data_type)
        raise ModelError(f"tensor '{t.name}' has type {name}",
                         hint="tileweave handles float16/32/64, (u)int8/16/32/64 and bool")
    return numpy_helper.to_array(t)


def _input_spec(vi, bound: tuple[int, ...] | None) -> TensorSpec:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise ModelError(f"input '{vi.name}' is not a tensor", hint="sequences and maps are not supported")
    if tt.elem_type not in ONNX_TO_DTYPE:
        import onnx

        raise ModelError(f"input '{vi.name}' has type {onnx.TensorProto.DataType.Name(tt.elem_type)}",
                         hint="tileweave handles float16/32/64, (u)int8/16/32/64 and bool")
    dtype = ONNX_TO_DTYPE[tt.elem_type]
    dims = []
    if tt.HasField("shape"):
        for k, d in enumerate(tt.shape.dim):
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or f"?{k}"))
    elif bound is None:
        raise ShapeError(f"input '{vi.name}' has no shape",
                         hint=f"bind it with --shape {vi.name}=d0,d1,...")
    if bound is not None:
        if tt.HasField("shape") and len(bound) != len(dims):
            raise ShapeError(f"--shape {vi.name} gives rank {len(bound)} but the input has rank {len(dims)}")
        for k, (d, b) in enumerate(zip(dims, bound)):
            if isinstance(d, int) and d != b:
                raise ShapeError(f"--shape {vi.name}: axis {k} is fixed to {d} in the model, got {b}")
        return TensorSpec(vi.name, tuple(int(b) for b in bound), dtype)
    for k, d in enumerate(dims):
        if isinstance(d, int) and d < 0:
            raise ShapeError(f"input '{vi.name}' declares a negative dimension {d} (axis {k})",
                             hint="fix the model's input shape (dims are >= 0, or symbolic)")
        if not isinstance(d, int) or d <= 0:
            example = ",".join(str(x) if isinstance(x, int) and x > 0 else "N" for x in dims)
            raise ShapeError(
                f"input '{vi.name}' has a dynamic dimension '{d}' (axis {k}) with no binding",
                hint=f"bind it with --shape {vi.name}={example} (N = your size)",
            )
    return TensorSpec(vi.name, tuple(dims), dtype)


def _node(proto, k: int, numpy_helper, opset: int = 0, within: str = "") -> OnnxNode:
    import onnx

    attrs = {}
    for a in proto.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = _tensor_value(v, numpy_helper)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        attrs[a.name] = v
    name = proto.name or f"{proto.op_type}_{k}"
    return OnnxNode(name, proto.op_type, proto.domain, tuple(proto.input), tuple(proto.output), attrs, opset, within)


def dtype_of_onnx(code: int) -> DType:
    if code not in ONNX_TO_DTYPE:
        import onnx

        raise ModelError(f"type {onnx.TensorProto.DataType.Name(code)} is not supported",
                         hint="tileweave handles float16/32/64, (u)int8/16/32/64 and bool")
    return ONNX_TO_DTYPE[code]
