"""What tileweave sends through Ray (tune's compile tasks and measure actors, the partition's device
actors): its own pickle bytes, never its objects.

In a process that had loaded NVRTC before starting Ray, Ray 2.60's serializer handed a device actor a dict
of TensorSpec with values under the wrong keys ('layer_norm_3' -> the spec of 'conv2d::conv'), while pickle
and cloudpickle round-trip the same dict intact; ConvNeXt's second device then computed garbage
(tests/engine/partition/test_execute.py reproduces it in a process of its own). Ray moves bytes as they are.
"""

from __future__ import annotations

import pickle


def pack(value) -> bytes:
    """cloudpickle (Ray's copy): functions a test injects travel by value, as Ray would send them."""
    from ray import cloudpickle

    return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(blob: bytes):
    return pickle.loads(blob)
