"""The OpenCL printer (engine/codegen/opencl.py) and backend (engine/runtime/opencl.py): the CUDA program's
kernels in OpenCL C, built and run on the first OpenCL device (PoCL's CPU device here and in CI) against
onnxruntime. Without an OpenCL device the run tests skip, unless TILEWEAVE_REQUIRE_OPENCL=1 (.ci/run sets
it, so CI cannot pass by skipping them)."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from sample_io import load_sample, rel_error

from engine.api import plan_model
from engine.codegen.generate import generate
from engine.codegen.opencl import render_opencl, segment_kernels
from engine.codegen.targets import CudaPrinter, render_cuda


def _device_or_skip():
    from engine.errors import BackendError
    from engine.runtime.opencl import opencl_device

    try:
        return opencl_device()[1]
    except BackendError as err:
        if os.environ.get("TILEWEAVE_REQUIRE_OPENCL") == "1":
            raise
        pytest.skip(f"no OpenCL device: {err}")


def _program(name: str, policy: str):
    graph, inputs, expected = load_sample(name)
    planned, plan = plan_model(graph, policy, "a100")
    return planned, generate(plan, planned, "a100", target="cuda"), inputs, expected


CUDA_ONLY = re.compile(r"threadIdx|blockIdx|blockDim|gridDim|__syncthreads|__shfl|cg::|__global__|__device__|"
                       r"extern \"C\"|__half|__restrict__|__launch_bounds__|long long")


@pytest.mark.parametrize("name,policy", [("layernorm_residual", "welder"), ("masked_softmax", "stitch"),
                                         ("bert_layer", "welder"), ("lstm", "welder"),
                                         ("mobilenetv2_block", "welder")])
def test_the_opencl_source_is_the_cuda_program_in_opencl_spellings(name, policy):
    _, program, _, _ = _program(name, policy)
    source = render_opencl(program)
    assert not CUDA_ONLY.findall(source)
    # The GEMM staging's float4 loads are CUDA's alone (OpenCL stages element by element from the same
    # IR, double buffers included): compare statements with CUDA's vector loads off.
    scalar = CudaPrinter()
    scalar.vector_loads = False
    cuda = scalar.render_program(program)
    kernels = re.findall(r"__kernel void (?:__attribute__\(\(reqd_work_group_size\((\d+), 1, 1\)\)\) )?(\w+)\(", source)
    want = [(str(part.threads), part.name) for k in program.kernels for part in segment_kernels(k)]
    assert kernels == want  # one OpenCL kernel per segment, in order, at the CUDA block size
    # Every tensor parameter is a __global pointer and nothing else in the signatures changed.
    for k in program.kernels:
        for b in k.params:
            assert re.search(rf"__global (const )?\w+\* restrict {re.escape(b.name)}\b", source)
    # Same loads, stores and arithmetic as the CUDA program: the bodies differ in spellings only. The
    # statement count matches except for what the printers do differently on purpose: CUDA's warp-shuffle
    # combine (a row reduced by one work-item in OpenCL) and the grid barrier (a kernel boundary in OpenCL).
    cuda_stores = len(re.findall(r"\w+\[[^\]]+\] = ", cuda))
    assert abs(len(re.findall(r"\w+\[[^\]]+\] = ", source)) - cuda_stores) <= 2 * len(re.findall("__shfl", cuda)) + 2


@pytest.mark.parametrize("name", ["layernorm_residual", "masked_softmax", "gelu_chain", "conv_bn_relu",
                                  "mobilenetv2_block", "pow_broadcast_add"])
@pytest.mark.parametrize("policy", ["unfused", "welder"])
def test_samples_run_on_opencl_and_match_onnxruntime(name, policy):
    _device_or_skip()
    from engine.runtime.opencl import run_opencl

    graph, program, inputs, expected = _program(name, policy)
    outs, profile = run_opencl(program, graph.specs, inputs, graph.weights, repeat=1)
    for out, want in expected.items():
        assert rel_error(outs[out], want) <= 1e-5, out
    assert profile.backend == "opencl" and len(profile.kernels) == len(program.launches)
    assert all(k.us > 0 for k in profile.kernels)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_layer", "vit_block", "lstm", "nerf_mlp"])
@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_whole_samples_run_on_opencl(name, policy):
    test_samples_run_on_opencl_and_match_onnxruntime(name, policy)


def test_run_and_compile_from_the_cli(tmp_path, capsys):
    _device_or_skip()
    from engine.cli import main

    sample = "samples/masked_softmax.onnx"
    out = tmp_path / "o.npz"
    assert main(["run", sample, "--backend", "opencl", "--policy", "welder", "--inputs",
                 "samples/masked_softmax.io.npz", "--outputs", str(out)]) == 0
    got, want = np.load(out), np.load("samples/masked_softmax.io.npz")
    assert all(rel_error(got[k], want[k]) <= 1e-5 for k in got.files)
    assert main(["compile", sample, "--target", "opencl", "-o", str(tmp_path / "cl")]) == 0
    assert (tmp_path / "cl" / "masked_softmax.cl").read_text().startswith("// generated by tileweave: OpenCL")


def test_no_opencl_is_one_line(monkeypatch, capsys):
    """Without a platform the backend says what to install (the stand-in replaces a real pyopencl name)."""
    pytest.importorskip("pyopencl")
    import pyopencl as cl

    from engine.cli import main

    assert hasattr(cl, "get_platforms")

    def none():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setattr(cl, "get_platforms", none)
    code = main(["run", "samples/masked_softmax.onnx", "--backend", "opencl", "--outputs", "/tmp/tw_never.npz"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no OpenCL platform" in err[0] and "pocl-opencl-icd" in err[0]


def _zoo(name: str):
    from engine.api import load_graph

    graph = load_graph(f"samples/zoo/{name}.onnx")
    data = np.load(f"samples/zoo/{name}.io.npz")
    return graph, {t.name: data[t.name] for t in graph.inputs}, {n: data[n] for n in graph.output_names}


@pytest.mark.parametrize("name", ["bert"])
def test_real_bert_welder_runs_on_opencl(name):
    """The exported BERT's welder plan completes its batched QKV projection for global memory in 2-row
    chunks, each row's LayerNorm statistics computed once per row inside the GEMM (a thread per row).
    The CUDA printer wrote that row as `m_lo + mm < m_n ? mm : 0` — every chunk but the first read rows
    0..1 (5e-2 off); found by running the kernels through this printer. Planned on an a100 without the
    cost model's latency term: the plan that prints this path (with the term, welder picks wider tiles)."""
    _device_or_skip()
    import dataclasses

    from engine.device import get_device
    from engine.runtime.opencl import run_opencl

    graph, inputs, expected = _zoo(name)
    a100 = dataclasses.replace(get_device("a100"), mem_latency_cycles=0.0)
    planned, plan = plan_model(graph, "welder", a100)
    program = generate(plan, planned, a100, target="cuda")
    assert "mm < m_n ? mm : 0" in render_cuda(program)  # the path this guards is printed
    outs, _ = run_opencl(program, planned.specs, inputs, planned.weights)
    for out, want in expected.items():
        assert rel_error(outs[out], want) <= 1e-5, out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "vit", "mobilevit", "swin", "convnext", "gpt2", "resnet",
                                  "efficientnet", "mobilenetv2", "lstm", "nerf", "decoder_kv"])
def test_zoo_welder_runs_on_opencl(name):
    test_real_bert_welder_runs_on_opencl(name)


@pytest.mark.parametrize("name", ["bert_layer", "nerf_mlp"])
def test_double_buffered_gemms_run_on_opencl_and_match_onnxruntime(name):
    _device_or_skip()
    from engine.runtime.opencl import run_opencl

    graph, program, inputs, expected = _program(name, "welder")
    assert any(g.buffers == 2 for k in program.kernels for g in k.gemms)  # the a100 pass double-buffers them
    outs, _ = run_opencl(program, graph.specs, inputs, graph.weights, repeat=1)
    for out, want in expected.items():
        assert rel_error(outs[out], want) <= 1e-5, out


def test_64_bit_integers_are_spelled_by_the_printers_table():
    """int64 in helpers, literals, reduction limits and argmax indices comes from the printer's table
    (OpenCL C reserves `long long`): OpenCL `long`/`L`, C and CUDA `long long`/`LL`; no text replaced."""
    from engine.codegen.kexpr import Reduce
    from engine.codegen.opencl import OpenCLPrinter
    from engine.codegen.printer import BodyWriter
    from engine.codegen.targets import CPrinter
    from engine.ir import expr as E
    from engine.ir import index as I
    from engine.ir.dtypes import DType
    from engine.ir.graph import Combine

    for printer, i64, suffix in ((OpenCLPrinter(), "long", "L"), (CPrinter(), "long long", "LL"),
                                 (CudaPrinter(), "long long", "LL")):
        assert printer.render_helper("lmod").endswith(f"{i64} lmod({i64} a, {i64} b) {{ {i64} r = a % b; "
                                                      "return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }")
        assert f"int widx({i64} v, int n)" in printer.render_helper("widx")
        assert printer.literal(-7, DType.I64) == f"-7{suffix}" and printer.storage_type(DType.I64) == i64
        body = E.IndexVal(I.var("r0"), DType.I64)
        for combine in (Combine.MAX, Combine.ARGMAX):
            ssa = BodyWriter(printer, None, {})
            ssa.value(Reduce(body, ("r0",), (5,), combine, DType.I64))
            text = "\n".join(ssa.lines)
            assert f"(-9223372036854775807{suffix} - 1)" in text and f"{i64} v" in text, text
            assert ("long long" in text) == (i64 == "long long")
