"""User-facing errors: one line naming what is wrong and how to fix it.

The CLI prints `error: <message>` and exits with code 2 for any TileweaveError; the app shows the
message. Raise these for bad input (files, shapes, plans, devices); let real bugs raise normally.
"""

from __future__ import annotations


class TileweaveError(Exception):
    """Bad input or an unsatisfiable request. `str(err)` is a single line."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None):
        message = " ".join(message.split())
        if hint:
            message = f"{message} ({' '.join(hint.split())})"
        super().__init__(message)


class ModelError(TileweaveError):
    """The ONNX model cannot be loaded, checked or lowered."""


class UnsupportedOpError(ModelError):
    """An ONNX op (or an attribute value of it) that the frontend does not convert."""


class ShapeError(TileweaveError):
    """A dynamic dimension without a binding, or inputs of the wrong shape/dtype."""


class DeviceError(TileweaveError):
    """An unknown device preset or a malformed device file."""


class PlanError(TileweaveError):
    """A plan that does not fit the model, the schema, or the legality rules."""


class CompileError(TileweaveError):
    """Generated code failed to compile, or the compiler is missing."""


class BackendError(TileweaveError):
    """A backend cannot run here (no CUDA device, a driver too old for the kernels, a launch refused, ...)."""


class BundleError(TileweaveError):
    """A kernel bundle that is not a zip, has unsafe entries (absolute, `..`, symlinks) or fails its manifest."""


class TimeLimitError(TileweaveError):
    """A compile or run outlived its time budget (`--time-limit`, TILEWEAVE_TIME_LIMIT) and was stopped."""


class PartitionError(TileweaveError):
    """A multi-device partition that cannot be made (too few kernels, no split fits the devices' memory)
    or run (Ray missing or a cluster address that does not answer)."""
