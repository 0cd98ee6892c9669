"""Element types of the primitive IR and their NumPy / C spellings."""

from __future__ import annotations

from enum import StrEnum

import numpy as np


class DType(StrEnum):
    F32 = "float32"
    F16 = "float16"
    I64 = "int64"
    I32 = "int32"
    BOOL = "bool"

    @property
    def np(self) -> np.dtype:
        return np.dtype(self.value)

    @property
    def itemsize(self) -> int:
        return self.np.itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16)

    @property
    def is_int(self) -> bool:
        return self in (DType.I64, DType.I32)

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
                hint="tileweave handles float32, float16, int64, int32 and bool tensors",
            ) from None


_SHORT = {DType.F32: "f32", DType.F16: "f16", DType.I64: "i64", DType.I32: "i32", DType.BOOL: "bool"}

# ONNX TensorProto data types -> DType (others are refused at import with a clear error).
ONNX_TO_DTYPE = {1: DType.F32, 10: DType.F16, 7: DType.I64, 6: DType.I32, 9: DType.BOOL}
DTYPE_TO_ONNX = {v: k for k, v in ONNX_TO_DTYPE.items()}
