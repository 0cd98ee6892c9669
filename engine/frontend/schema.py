"""Checks an ONNX model must pass before the frontend converts it: the default-domain opset within the
range this tileweave knows, and every node's input types against its ONNX schema (type constraints
such as Add's `T` bind all of their inputs to one type). Each failure is one ModelError line."""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import ModelError
from engine.ir.dtypes import DType

MIN_OPSET = 7
# Opset 6 and older models are refused (upgrade hint); the newest is the newest the installed onnx
# package has schemas for: a node of a newer opset cannot be checked against its schema.


def max_opset() -> int:
    import onnx.defs

    return int(onnx.defs.onnx_opset_version())


def check_opset(opset: int | None) -> int:
    """The default-domain opset, or ModelError naming the supported range."""
    supported = f"tileweave reads opsets {MIN_OPSET} to {max_opset()}"
    if opset is None:
        raise ModelError("model imports no default-domain opset", hint=f"{supported}; re-export the model")
    if opset < MIN_OPSET:
        raise ModelError(f"opset {opset} is too old ({supported})",
                         hint="upgrade it with onnx.version_converter.convert_version(model, 17)")
    if opset > max_opset():
        raise ModelError(f"opset {opset} of the default domain is newer than this tileweave knows ({supported})",
                         hint="re-export the model for an opset in that range")
    return int(opset)


def onnx_type_name(dtype: DType) -> str:
    """The schema spelling of a tensor type: float32 -> 'tensor(float)'."""
    name = {DType.F32: "float", DType.F64: "double"}.get(dtype, dtype.value.replace("float8_", "float8"))
    return f"tensor({name})"


def check_node_types(op_type: str, domain: str, name: str, opset: int, inputs: Sequence[str],
                     dtypes: Sequence[DType | None]) -> None:
    """Refuse a node whose input types break its schema (a type outside a constraint's allowed set, or
    two inputs bound to one type parameter with different types). `dtypes[k]` is None for an absent
    optional input. Ops without a schema are left to the converter lookup, which names them."""
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return
    params = list(schema.inputs)
    if not params:
        return
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    bound: dict[str, tuple[str, str, str]] = {}  # type parameter -> (first input bound to it, its types)
    for k, (value, dtype) in enumerate(zip(inputs, dtypes)):
        if not value or dtype is None:
            continue
        param = params[min(k, len(params) - 1)]
        if k >= len(params) and param.option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
            return  # too many inputs: onnx.checker has already named that
        got = onnx_type_name(dtype)
        slot = param.name if k < len(params) else f"{param.name}[{k - len(params) + 1}]"
        where = f"node '{name}' ({op_type}, opset {opset})"
        if param.type_str in allowed:
            if got not in allowed[param.type_str]:
                kinds = ", ".join(sorted(t[7:-1] for t in allowed[param.type_str]))
                raise ModelError(f"{where}: input {slot} ('{value}') is {dtype.value}, which {op_type} does not take "
                                 f"(type {param.type_str} allows {kinds})", hint="insert a Cast before it")
            homogeneous = param.option != onnx.defs.OpSchema.FormalParameterOption.Variadic \
                or param.is_homogeneous
            first = bound.get(param.type_str)
            if first is None:
                if homogeneous:
                    bound[param.type_str] = (slot, got, dtype.value)
            elif first[1] != got:
                raise ModelError(f"{where}: input {slot} ('{value}') is {dtype.value} but input {first[0]} is "
                                 f"{first[2]}; ONNX requires all inputs of type {param.type_str} to be one type",
                                 hint=f"insert a Cast so that both are {first[2]}")
        elif param.type_str.startswith("tensor(") and got != param.type_str:
            raise ModelError(f"{where}: input {slot} ('{value}') is {dtype.value}, but {op_type} takes "
                             f"{param.type_str[7:-1]} there", hint="insert a Cast before it")
