"""ONNX ops the standard defines as functions (MeanVarianceNormalization, Swish, SwiGLU, the window functions,
the losses, ...) and no converter handles: at import the node is replaced by its function's body — the
schema's body for the model's opset, or the body the schema builds for the node's attributes and input types
(a context-dependent function) — with the body's values renamed under the node's name and its attribute
references bound to the node's attributes (or their defaults). Each body node runs at the opset its body was
written for, and is expanded again where it is itself a function op without a converter."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from engine.ir.dtypes import DType


def _schema(op_type: str, opset: int):
    import onnx

    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def is_function(op_type: str, opset: int | None = None) -> bool:
    """Whether `op_type` (default domain) is defined by a function at `opset` (the newest when None)."""
    import onnx

    schema = _schema(op_type, onnx.defs.onnx_opset_version() if opset is None else opset)
    return schema is not None and bool(schema.has_function or schema.has_context_dependent_function)


def function_ops(converted: set[str]) -> list[str]:
    """Default-domain ops without a converter (not in `converted`) that the newest opset defines by a function
    whose body's ops are all handled — by a converter, or as such a function in turn. A context-dependent
    function's body is the one built for the op's node without attributes on its inputs' first allowed types
    (float where allowed); one that cannot be built so (sequence inputs) is left out, as are those whose bodies
    need an op nothing handles (Bernoulli's random numbers, LinearAttention's Scan)."""
    import onnx

    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == "" and not s.deprecated}
    verdict: dict[str, bool] = {}

    def handled(op: str) -> bool:
        if op in converted:
            return True
        if op not in verdict:
            verdict[op] = False  # no function names itself; a cycle would not be handled
            ops = _probe_ops(op) if is_function(op) else None
            verdict[op] = ops is not None and all(handled(o) for o in ops)
        return verdict[op]

    return sorted(n for n in names - converted if is_function(n) and handled(n))


def _probe_ops(op_type: str) -> set[str] | None:
    """The op types of `op_type`'s function body at the newest opset, built for a node of it without
    attributes (`function_ops`); None where it cannot be built."""
    import onnx
    from onnx import helper

    schema = _schema(op_type, onnx.defs.onnx_opset_version())
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    types = []
    for formal in schema.inputs:
        options = allowed.get(formal.type_str, [formal.type_str])
        pick = "tensor(float)" if "tensor(float)" in options else options[0]
        if not (pick.startswith("tensor(") and pick.endswith(")")):
            return None  # a sequence or optional input
        code = onnx.TensorProto.DataType.Value(pick[7:-1].upper())
        types.append(helper.make_tensor_type_proto(code, [2, 3]))
    node = helper.make_node(op_type, [f"in{j}" for j in range(len(types))], [o.name for o in schema.outputs])
    try:
        got = _body(node, onnx.defs.onnx_opset_version(), types)
    except Exception:  # the schema's builder refuses the probe's types: nothing to claim
        return None
    return None if got is None else {n.op_type for n in got[0].node if n.domain in ("", "ai.onnx")}


def _body(proto, opset: int, input_types: list):
    """(FunctionProto, its opset) of `proto`'s op at `opset`; None where the op has no function there."""
    import onnx

    schema = _schema(proto.op_type, opset)
    if schema is None:
        return None
    fn = onnx.FunctionProto()
    versions = [v for v in schema.function_opset_versions if v <= opset]
    if schema.has_function and versions:
        fn.ParseFromString(schema.get_function_with_opset_version(max(versions)))
    elif schema.has_context_dependent_function:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset] or [opset]
        raw = schema.get_context_dependent_function_with_opset_version(
            max(versions), proto.SerializeToString(), [t.SerializeToString() for t in input_types])
        if not raw:
            return None
        fn.ParseFromString(raw)
    else:
        return None
    body_opset = next((o.version for o in fn.opset_import if o.domain in ("", "ai.onnx")), opset)
    return fn, body_opset, schema


def expand(proto, name: str, opset: int, input_types: list) -> tuple[list, int] | None:
    """The body nodes (NodeProtos, renamed and with attributes bound) standing for `proto` (named `name`) and
    the opset they are written for; None where its op has no function at `opset`."""
    import onnx

    got = _body(proto, opset, input_types)
    if got is None:
        return None
    fn, body_opset, schema = got
    given = {a.name: a for a in proto.attribute}
    defaults = {a.name: a for a in fn.attribute_proto}
    for key, attr in schema.attributes.items():
        if attr.default_value.type != onnx.AttributeProto.UNDEFINED:
            defaults.setdefault(key, attr.default_value)
    rename: dict[str, str] = {"": ""}
    rename.update(zip(fn.input, list(proto.input) + [""] * (len(fn.input) - len(proto.input))))
    rename.update(zip(fn.output, list(proto.output) + [""] * (len(fn.output) - len(proto.output))))

    def value(v: str) -> str:
        return rename.setdefault(v, f"{name}::{v}")

    out = []
    for j, node in enumerate(fn.node):
        body = onnx.NodeProto()
        body.CopyFrom(node)
        body.name = f"{name}/{node.name or f'{node.op_type}_{j}'}"
        body.ClearField("input")
        body.ClearField("output")
        body.input.extend(value(v) for v in node.input)
        body.output.extend(value(v) for v in node.output)
        body.ClearField("attribute")
        for attr in node.attribute:
            if not attr.ref_attr_name:
                body.attribute.append(attr)
                continue
            bound = given.get(attr.ref_attr_name) or defaults.get(attr.ref_attr_name)
            if bound is None:
                continue  # an optional attribute the node leaves out: the body op's own default
            copy = onnx.AttributeProto()
            copy.CopyFrom(bound)
            copy.name = attr.name
            body.attribute.append(copy)
        out.append(body)
    return out, body_opset


def tensor_type(dtype: DType, shape) -> object:
    """An ONNX TypeProto of a tensor of `dtype` and `shape` (a context-dependent function's input type)."""
    from onnx import helper

    from engine.ir.dtypes import ONNX_TO_DTYPE

    code = next(c for c, d in ONNX_TO_DTYPE.items() if d == dtype)
    return helper.make_tensor_type_proto(code, list(shape))


def nodes_of(proto, k: int, opset: int, converted: Mapping, type_of: Callable[[str], object | None],
             make: Callable) -> Iterator:
    """The OnnxNodes (`make(proto, k, opset, within)`) that `proto` lowers as: itself where a converter handles
    it (or it is not a function op, whose error the caller raises), else its function body's, each expanded in
    turn. A generator: each node is made after the ones before it ran (`type_of` reads their outputs' types)."""
    yield from _nodes(proto, k, opset, converted, type_of, make, "")


def _nodes(proto, k, opset, converted, type_of, make, within: str) -> Iterator:
    if proto.domain not in ("", "ai.onnx") or proto.op_type in converted or not is_function(proto.op_type, opset):
        yield make(proto, k, opset, within)
        return
    types = [type_of(v) if v else None for v in proto.input]
    if any(t is None for v, t in zip(proto.input, types) if v):
        yield make(proto, k, opset, within)  # an input nothing produces: the caller says so
        return
    name = proto.name or f"{proto.op_type}_{k}"
    got = expand(proto, name, opset, [t for t in types if t is not None])
    if got is None:
        yield make(proto, k, opset, within)
        return
    body, body_opset = got
    for node in body:
        yield from _nodes(node, k, body_opset, converted, type_of, make, within or proto.op_type)
