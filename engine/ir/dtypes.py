"""Element types of the primitive IR and their NumPy / C spellings."""

from __future__ import annotations

from enum import StrEnum

import ml_dtypes  # registers bfloat16 and the float8 types with NumPy
import numpy as np


class DType(StrEnum):
    F32 = "float32"
    F16 = "float16"
    I64 = "int64"
    I32 = "int32"
    BOOL = "bool"
    # Less common types ONNX models and its conformance tests use; kernels handle them too.
    F64 = "float64"
    I16 = "int16"
    I8 = "int8"
    U8 = "uint8"
    U16 = "uint16"
    U32 = "uint32"
    U64 = "uint64"
    # Low-precision floats (ONNX Cast/quantization); the reference executor handles them through
    # ml_dtypes. bfloat16 also runs in kernels (stored as its 16 bits, math in fp32: Printer.bf16_type);
    # the printers have no float8 spelling (generate refuses those with a clear error).
    BF16 = "bfloat16"
    F8E4M3FN = "float8_e4m3fn"
    F8E4M3FNUZ = "float8_e4m3fnuz"
    F8E5M2 = "float8_e5m2"
    F8E5M2FNUZ = "float8_e5m2fnuz"

    @property
    def np(self) -> np.dtype:
        if self in _LOW_FLOATS:
            return np.dtype(getattr(ml_dtypes, self.value))
        return np.dtype(self.value)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]  # a table: the cost model asks for it hundreds of thousands of times a plan

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.F64) or self in _LOW_FLOATS

    @property
    def is_low_float(self) -> bool:
        """bfloat16 / float8 (ml_dtypes types; no C99 spelling: c_type has none, the printers spell bf16)."""
        return self in _LOW_FLOATS

    @property
    def finite_range(self) -> tuple[float, float]:
        info = ml_dtypes.finfo(self.np)
        return float(info.min), float(info.max)

    @property
    def is_int(self) -> bool:
        return self in (DType.I64, DType.I32, DType.I16, DType.I8, DType.U8, DType.U16, DType.U32, DType.U64)

    @property
    def c_type(self) -> str:
        """C99 spelling (float16 is printer-specific and handled there)."""
        return _C[self]

    @property
    def short(self) -> str:
        return _SHORT[self]

    @staticmethod
    def from_np(dtype: np.dtype | type | str) -> DType:
        name = np.dtype(dtype).name
        try:
            return DType(name)
        except ValueError:
            from engine.errors import ModelError

            raise ModelError(
                f"dtype {name} is not supported",
                hint="tileweave handles float16/32/64, (u)int8/16/32/64 and bool tensors",
            ) from None


_SHORT = {DType.F32: "f32", DType.F16: "f16", DType.I64: "i64", DType.I32: "i32", DType.BOOL: "bool",
          DType.F64: "f64", DType.I16: "i16", DType.I8: "i8", DType.U8: "u8", DType.U16: "u16",
          DType.U32: "u32", DType.U64: "u64", DType.BF16: "bf16", DType.F8E4M3FN: "f8e4m3fn",
          DType.F8E4M3FNUZ: "f8e4m3fnuz", DType.F8E5M2: "f8e5m2", DType.F8E5M2FNUZ: "f8e5m2fnuz"}
_LOW_FLOATS = frozenset((DType.BF16, DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ))
_C = {DType.F32: "float", DType.F16: "half", DType.I64: "long long", DType.I32: "int", DType.BOOL: "bool",
      DType.F64: "double", DType.I16: "short", DType.I8: "signed char", DType.U8: "unsigned char",
      DType.U16: "unsigned short", DType.U32: "unsigned int", DType.U64: "unsigned long long"}

# ONNX TensorProto data types -> DType (others are refused at import with a clear error).
ONNX_TO_DTYPE = {1: DType.F32, 10: DType.F16, 7: DType.I64, 6: DType.I32, 9: DType.BOOL, 11: DType.F64,
                 5: DType.I16, 3: DType.I8, 2: DType.U8, 4: DType.U16, 12: DType.U32, 13: DType.U64,
                 16: DType.BF16, 17: DType.F8E4M3FN, 18: DType.F8E4M3FNUZ, 19: DType.F8E5M2, 20: DType.F8E5M2FNUZ}
DTYPE_TO_ONNX = {v: k for k, v in ONNX_TO_DTYPE.items()}


_ITEMSIZE = {d: d.np.itemsize for d in DType}
