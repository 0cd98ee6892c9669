"""CPU backend (engine/runtime/cpu.py via execute.run_model): generated C for every sample × plan
matches onnxruntime (max error ≤ 1e-3 relative to max |ref|, fp32)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from plans import HAND_FUSED, hand_conns, make_test_plan, policy_plan  # noqa: E402
from sample_io import RUNNABLE, load_sample, rel_error  # noqa: E402

from engine.errors import ShapeError, UnsupportedOpError  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402

POLICIES = ("unfused", "elementwise", "stitch", "welder")
TOL = 1e-3


def _sample(name):
    try:
        return load_sample(name)
    except UnsupportedOpError as err:
        pytest.skip(f"frontend does not convert {name} yet: {err}")


def _check(result, expected):
    assert result.outputs.keys() == expected.keys()
    for k, want in expected.items():
        got = result.outputs[k]
        assert got.shape == want.shape, k
        assert rel_error(got, want) <= TOL, (k, rel_error(got, want))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", RUNNABLE)
def test_sample_matches_onnxruntime(name, policy):
    graph, inputs, expected = _sample(name)
    plan = policy_plan(graph, policy)
    result = run_model(graph, inputs, backend="cpu", plan=plan)
    _check(result, expected)
    assert len(result.program.launches) == len(plan.groups)
    assert result.profile.label == "measured on CPU (C backend)"
    assert all(k.us > 0 for k in result.profile.kernels)


@pytest.mark.parametrize("case", sorted(HAND_FUSED))
def test_grid_barrier_plans_match(case):
    name, overrides, tiles = HAND_FUSED[case]
    graph, inputs, expected = _sample(name)
    plan = make_test_plan(graph, hand_conns(graph, overrides), tiles)
    result = run_model(graph, inputs, backend="cpu", plan=plan)
    assert len(result.program.kernels) == 1
    assert result.program.kernels[0].cooperative and result.program.launches[0].cooperative
    _check(result, expected)


def test_outputs_are_written_everywhere():
    # NaN-filled output buffers would survive a kernel that skips elements; the executor allocates
    # with np.empty, so also run twice with different inputs and check the results differ accordingly.
    graph, inputs, expected = _sample("layernorm_residual")
    # Tiles a third of a row wide: each recomputes its rows' statistics (3.3x the work, allowed here).
    plan = make_test_plan(graph, hand_conns(graph, {}), options={"recompute_bound": 4.0})
    rng = np.random.default_rng(7)
    other = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in inputs.items()}
    a = run_model(graph, inputs, plan=plan).outputs["y"]
    b = run_model(graph, other, plan=plan).outputs["y"]
    ref = run_model(graph, other, backend="reference").outputs["y"]
    assert rel_error(a, expected["y"]) <= TOL
    assert rel_error(b, ref) <= TOL and not np.allclose(a, b)


def test_wrong_input_shape_is_a_shape_error():
    graph, inputs, _ = _sample("gelu_chain")
    bad = {"x": inputs["x"][:, :10]}
    with pytest.raises(ShapeError, match="input 'x' has shape"):
        run_model(graph, bad, plan=make_test_plan(graph))


def test_unknown_backend_is_refused():
    from engine.errors import BackendError

    graph, inputs, _ = _sample("gelu_chain")
    with pytest.raises(BackendError, match="unknown backend"):
        run_model(graph, inputs, backend="tpu", plan=make_test_plan(graph))


def test_cuda_backend_without_device_is_one_line_error():
    from engine.errors import BackendError
    from engine.runtime.cuda_driver import cuda_available

    if cuda_available()[0]:
        pytest.skip("a CUDA device is attached")
    graph, inputs, _ = _sample("gelu_chain")
    with pytest.raises(BackendError) as err:
        run_model(graph, inputs, backend="cuda", plan=make_test_plan(graph))
    assert "\n" not in str(err.value)


def test_library_mode_runs_lone_contractions_through_blas_and_still_matches():
    graph, inputs, expected = _sample("nerf_mlp")
    plan = policy_plan(graph, "stitch")
    result = run_model(graph, inputs, plan=plan, library=True)
    _check(result, expected)
    assert "NumPy BLAS" in result.profile.label


@pytest.mark.parametrize("policy", ["unfused", "welder"])
@pytest.mark.parametrize("name", ["masked_softmax", "bert_layer"])
def test_the_program_entry_runs_every_launch_in_one_call(name, policy):
    """`program_call`: the C entry (tw_program) runs the launches in order over one pointer array, as the
    per-launch calls do: same outputs, bit for bit, from buffers filled with NaN first (every intermediate
    and output is written by the entry itself)."""
    from engine.codegen.generate import generate
    from engine.runtime.cpu import bind_buffers, compile_program_c, launch_calls, program_call

    graph, inputs, expected = _sample(name)
    plan = policy_plan(graph, policy)
    program = generate(plan, graph, "host", target="c")
    module = compile_program_c(program)
    assert "void tw_program(void* const* tw_b)" in module.source
    envs = []
    for run in (lambda env: [call() for call in launch_calls(module, env)], lambda env: program_call(module, env)()):
        env = bind_buffers(program, graph.specs, inputs, graph.weights)
        for t in program.launch_tensors:
            if t not in program.inputs and t not in program.constants:
                env[t][...] = np.nan
        run(env)
        envs.append({name_: env[t].copy() for name_, t in zip(program.output_names, program.outputs)})
    for k, want in expected.items():
        assert np.array_equal(envs[0][k], envs[1][k])
        assert rel_error(envs[1][k], want) <= TOL


def test_every_bound_buffer_starts_on_a_cache_line():
    """`bind_buffers` puts each input, weight, output and the arena on a 64-byte line (the arena's tensors at
    the memory plan's aligned offsets), copying a weight NumPy placed elsewhere, so a vector load never
    straddles two lines whatever the allocator gave; the values and the outputs are unchanged."""
    from engine.codegen.generate import generate
    from engine.runtime.cpu import LINE, bind_buffers, compile_program_c, program_call

    graph, inputs, expected = _sample("bert_layer")
    program = generate(policy_plan(graph, "welder"), graph, "host", target="c")
    weights = {}
    for name, w in graph.weights.items():  # each weight 16 bytes past a line
        raw = np.empty(w.nbytes + 2 * LINE, np.uint8)
        start = -raw.ctypes.data % LINE + 16
        weights[name] = raw[start:start + w.nbytes].view(w.dtype).reshape(w.shape)
        weights[name][...] = w
    env = bind_buffers(program, graph.specs, inputs, weights)
    assert all(env[t].ctypes.data % LINE == 0 for t in program.launch_tensors)
    assert all(np.array_equal(env[t], graph.weights[t]) for t in program.constants)
    program_call(compile_program_c(program), env)()
    for k, t in zip(program.output_names, program.outputs):
        assert rel_error(env[t], expected[k]) <= TOL
