"""ONNX op converters, one small function per op (or family), registered in one table
(`engine.frontend.context.CONVERTERS`). Importing this package registers them all."""

from engine.frontend.ops import (  # noqa: F401
    attention,
    conv,
    einsum,
    elementwise,
    grid_sample,
    layout,
    nn,
    norm,
    pool,
    quant,
    quant_integer,
    reduce,
    resize,
    rnn,
    scatter,
    shape,
    spectral,
)
