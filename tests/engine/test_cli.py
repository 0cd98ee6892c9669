"""Tests for the `tileweave info` / `tileweave run` contract (engine/commands.py) and its bad-input
handling: every error is one `error: ...` line on stderr with exit code 2, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from support import EXTERNAL_W, external_data_model, max_rel_error, run_ort, sample_path, tiny_model

import engine.api
from engine.cli import main
from engine.commands import parse_shapes
from engine.errors import ShapeError


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


# ---- info -----------------------------------------------------------------------------------


def test_info_json_keys_and_totals(capsys):
    code, out, _ = run_cli(capsys, "info", sample_path("bert_layer"), "--json")
    assert code == 0
    info = json.loads(out)
    assert {"onnx_ops", "stages", "param_bytes", "flops", "min_dram_bytes", "inputs", "outputs",
            "model_hash"} <= info.keys()
    model = onnx.load(str(sample_path("bert_layer")))
    want_ops: dict[str, int] = {}
    for n in model.graph.node:
        want_ops[n.op_type] = want_ops.get(n.op_type, 0) + 1
    assert info["onnx_ops"] == want_ops
    assert sum(info["stages"].values()) == info["stage_count"] > 0
    assert info["stages"]["contraction"] == 8  # Q, K, V, scores, context, output, FFN x2
    assert [t["name"] for t in info["inputs"]] == ["hidden", "attention_mask"]
    assert info["outputs"][0]["shape"] == [1, 128, 768]
    io_bytes = sum(t["bytes"] for t in info["inputs"] + info["outputs"])
    assert info["min_dram_bytes"] == io_bytes + info["param_bytes"]
    # 8 matmuls dominate: 2*128*768*768*4 (QKV+out) + 2*128*768*3072*2 (FFN) + 2*2*12*128*128*64.
    matmul_flops = 2 * 128 * 768 * 768 * 4 + 2 * 128 * 768 * 3072 * 2 + 2 * 2 * 12 * 128 * 128 * 64
    assert matmul_flops <= info["flops"] < 1.2 * matmul_flops


def test_info_text_table(capsys):
    code, out, _ = run_cli(capsys, "info", sample_path("gelu_chain"))
    assert code == 0
    assert "onnx" in out and "Tanh 1" in out and "elementwise" in out
    assert "min DRAM bytes" in out and "[128,3072]" in out


def test_info_binds_symbolic_dims(capsys, save_model):
    path = save_model(tiny_model("Relu", ("batch", 5)))
    code, out, _ = run_cli(capsys, "info", path, "--json", "--shape", "x=3,5")
    assert code == 0
    assert json.loads(out)["inputs"][0]["shape"] == [3, 5]


# ---- run ------------------------------------------------------------------------------------


def test_run_reference_with_io_matches_stored_outputs(capsys, tmp_path):
    out_path = tmp_path / "out.npz"
    io = sample_path("masked_softmax").with_suffix(".io.npz")
    code, out, _ = run_cli(capsys, "run", sample_path("masked_softmax"), "--backend", "reference",
                           "--inputs", io, "--outputs", out_path)
    assert code == 0
    assert f"wrote 1 output(s) to {out_path}" in out and "probs  [1,12,128,128] float32  min" in out
    got = np.load(out_path)
    assert got.files == ["probs"]
    assert max_rel_error(got["probs"], np.load(io)["probs"]) <= 1e-4
    # members in .npy format 1.0 (engine/runtime/npz.py:npz_bytes), which every NumPy reads: numpy 2.5.2
    # could not load what its own np.savez wrote into a BytesIO (docs/gpu.md)
    import zipfile

    with zipfile.ZipFile(out_path) as z:
        assert z.namelist() == ["probs.npy"] and z.read("probs.npy")[6:8] == bytes([1, 0])


def test_run_generates_missing_inputs_and_matches_ort(capsys, tmp_path):
    model = sample_path("layernorm_residual")
    given = np.load(model.with_suffix(".io.npz"))
    inputs_path = tmp_path / "in.npz"
    first = [n for n in given.files if n != "y"][0]
    np.savez(inputs_path, **{first: given[first]})  # the other input is generated
    code, out, _ = run_cli(capsys, "run", model, "--inputs", inputs_path, "--outputs", tmp_path / "o.npz")
    assert code == 0 and "generated inputs (seed 0)" in out
    from engine.api import load_graph
    from engine.runtime.inputs import make_inputs

    feeds = make_inputs(load_graph(model))
    feeds[first] = given[first]
    want = run_ort(model, feeds)["y"]
    assert max_rel_error(np.load(tmp_path / "o.npz")["y"], want) <= 1e-4


def test_run_cpu_plans_like_the_other_commands_and_calls_run_model(capsys, tmp_path, monkeypatch):
    seen = {}

    def fake_run_model(graph, inputs, *, backend, device, plan, budget, time_limit, repeat):
        seen.update(backend=backend, device=device, policy=plan.policy, inputs=sorted(inputs),
                    batching=dict(plan.options).get("batching"), budget=budget.source, time_limit=time_limit,
                    repeat=repeat)
        from engine.runtime.execute import RunResult

        return RunResult({"y": np.ones((2, 2), np.float32)}, None)

    import inspect

    real = inspect.signature(engine.api.run_model).parameters  # the stand-in takes only what run_model takes
    assert set(inspect.signature(fake_run_model).parameters) <= set(real)
    monkeypatch.setattr(engine.api, "run_model", fake_run_model, raising=False)
    code, out, _ = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cpu", "--policy", "stitch",
                           "--device", "h100", "--outputs", tmp_path / "o.npz")
    assert code == 0, out
    assert seen == {"backend": "cpu", "policy": "stitch", "device": "h100", "inputs": ["x"], "batching": False,
                    "budget": seen["budget"], "time_limit": None, "repeat": 1}
    assert "host RAM" in seen["budget"]  # cpu runs are held to the host's budget, not the GPU preset's
    assert np.load(tmp_path / "o.npz")["y"].shape == (2, 2)
    code, out, _ = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cpu", "--no-batching",
                           "--outputs", tmp_path / "o.npz")
    assert code == 0 and seen["batching"] is False and seen["policy"] == "welder", out
    code, out, _ = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cpu", "--outputs", tmp_path / "o.npz")
    assert code == 0 and seen["batching"] is True and seen["policy"] == "welder", out
    monkeypatch.setenv("TILEWEAVE_TIME_LIMIT", "45")
    code, out, _ = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cpu", "--outputs", tmp_path / "o.npz")
    assert code == 0 and seen["time_limit"] == 45.0, out
    code, out, _ = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cpu", "--time-limit", "2.5",
                           "--outputs", tmp_path / "o.npz")
    assert code == 0 and seen["time_limit"] == 2.5, out  # the flag wins over the environment


def test_run_cpu_backend_end_to_end(capsys, tmp_path):
    io = sample_path("gelu_chain").with_suffix(".io.npz")
    code, out, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cpu", "--inputs", io,
                             "--outputs", tmp_path / "o.npz")
    assert code == 0, err
    assert max_rel_error(np.load(tmp_path / "o.npz")["y"], np.load(io)["y"]) <= 1e-4


# ---- bad input ------------------------------------------------------------------------------


def test_not_an_onnx_file(capsys, tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is a text file, not a model\n" * 4)
    code, _, err = run_cli(capsys, "info", path)
    assert_one_line_error(code, err, "notes.onnx", "not an ONNX")


def test_truncated_protobuf(capsys, tmp_path):
    data = sample_path("gelu_chain").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    code, _, err = run_cli(capsys, "info", path)
    assert_one_line_error(code, err, "cut.onnx", "truncated or corrupt")


def test_missing_model_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "info", tmp_path / "nope.onnx")
    assert_one_line_error(code, err, "does not exist")


def test_unsupported_op_names_op_node_and_docs(capsys, save_model):
    path = save_model(tiny_model("Det", (3, 3)))
    code, _, err = run_cli(capsys, "info", path)
    assert_one_line_error(code, err, "Det", "det_0", "docs/onnx-conformance.md")


def test_dynamic_dim_without_binding(capsys, save_model):
    path = save_model(tiny_model("Relu", ("batch", 5)))
    code, _, err = run_cli(capsys, "info", path)
    assert_one_line_error(code, err, "'x'", "batch", "--shape x=N,5")


def test_run_binds_dynamic_dims_from_the_inputs_given(capsys, tmp_path, save_model):
    """`run --inputs` binds a dynamic dimension --shape leaves unbound to its array's shape (an exported
    bert-base's batch and sequence axes); an array of the wrong rank leaves it unbound, and the error says so."""
    path = save_model(tiny_model("Relu", ("batch", 5)))
    x = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    code, _, _ = run_cli(capsys, "run", path, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "o.npz")
    assert code == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], np.maximum(x, 0))
    np.savez(tmp_path / "bad.npz", x=x[None])
    code, _, err = run_cli(capsys, "run", path, "--inputs", tmp_path / "bad.npz", "--outputs", tmp_path / "o.npz")
    assert_one_line_error(code, err, "'x'", "batch", "--shape x=N,5")


def test_external_data_outside_folder_refused(capsys, tmp_path, save_model):
    (tmp_path / "secret.bin").write_bytes(np.ones(6, np.float32).tobytes())
    path = save_model(external_data_model("../secret.bin"), "model/m.onnx")
    code, _, err = run_cli(capsys, "info", path)
    assert_one_line_error(code, err, "'w'", "outside the model's folder", "refused")


def test_external_data_inside_folder_runs(capsys, tmp_path, save_model):
    path = save_model(external_data_model("w.bin"), "model/m.onnx")
    (path.parent / "w.bin").write_bytes(EXTERNAL_W.tobytes())
    code, _, _ = run_cli(capsys, "run", path, "--outputs", tmp_path / "o.npz")
    assert code == 0
    from engine.ir.dtypes import DType
    from engine.ir.graph import TensorSpec
    from engine.runtime.inputs import make_inputs

    x = make_inputs([TensorSpec("x", (2, 3), DType.F32)])["x"]
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], x + EXTERNAL_W, rtol=1e-6)


@pytest.mark.parametrize(("array", "needles"), [
    (np.ones((128, 7), np.float32), ("'x'", "[128,7]", "expected [128,3072]")),
    (np.ones((128, 3072), np.float64), ("'x'", "float64", "expected float32")),
])
def test_npz_wrong_shape_or_dtype(capsys, tmp_path, array, needles):
    np.savez(tmp_path / "in.npz", x=array)
    code, _, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--inputs", tmp_path / "in.npz",
                           "--outputs", tmp_path / "o.npz")
    assert_one_line_error(code, err, *needles)


def test_npz_unknown_array_name(capsys, tmp_path):
    np.savez(tmp_path / "in.npz", xx=np.ones(3, np.float32))
    code, _, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--inputs", tmp_path / "in.npz",
                           "--outputs", tmp_path / "o.npz")
    assert_one_line_error(code, err, "xx", "not model inputs")


def test_npz_not_readable(capsys, tmp_path):
    (tmp_path / "in.npz").write_text("garbage")
    code, _, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--inputs", tmp_path / "in.npz",
                           "--outputs", tmp_path / "o.npz")
    assert_one_line_error(code, err, "cannot read inputs file")


@pytest.mark.parametrize("spec", ["x", "x=1,a", "=1,2", "x=0,3", "x=1,,2"])
def test_malformed_shape(capsys, save_model, spec):
    path = save_model(tiny_model("Relu", ("batch", 5)))
    code, _, err = run_cli(capsys, "info", path, "--shape", spec)
    assert_one_line_error(code, err, "--shape")


def test_shape_for_unknown_input(capsys, save_model):
    path = save_model(tiny_model("Relu", ("batch", 5)))
    code, _, err = run_cli(capsys, "info", path, "--shape", "y=1,5")
    assert_one_line_error(code, err, "unknown input", "y", "inputs are: x")


def test_parse_shapes():
    assert parse_shapes(["x=1,128", "s=", "a=b=4"]) == {"x": (1, 128), "s": (), "a=b": (4,)}
    with pytest.raises(ShapeError, match="twice"):
        parse_shapes(["x=1", "x=2"])


def test_unknown_backend(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "tpu", "--outputs", tmp_path / "o.npz")
    assert_one_line_error(code, err, "unknown backend 'tpu'", "reference, cpu, cuda")


def test_unknown_device(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(engine.api, "run_model", lambda *a, **k: {}, raising=False)
    code, _, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cpu", "--device", "tpu9",
                           "--outputs", tmp_path / "o.npz")
    assert_one_line_error(code, err, "unknown device 'tpu9'")


@pytest.mark.parametrize("where", ["missing_dir", "is_dir"])
def test_output_not_writable(capsys, tmp_path, where):
    target = tmp_path / "no" / "such" / "o.npz" if where == "missing_dir" else tmp_path
    code, out, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--outputs", target)
    assert_one_line_error(code, err, str(target))
    assert out == ""  # refused before running


def test_console_script_prints_no_traceback(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x08\x07\x12")  # starts like a ModelProto, then stops
    proc = subprocess.run([sys.executable, "-m", "engine", "info", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_app_command_starts_streamlit_on_the_workbench(monkeypatch, capsys):
    import subprocess

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    assert main(["app", "--port", "8612"]) == 0
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4].endswith("app/streamlit_app.py")
    assert cmd[cmd.index("--server.port") + 1] == "8612" and "127.0.0.1" in cmd
    assert cmd[cmd.index("--runner.postScriptGC") + 1] == "false"
    assert "http://127.0.0.1:8612" in capsys.readouterr().out


# ---- time limits ----------------------------------------------------------------------------


def test_time_limit_stops_the_c_compile_then_the_cpu_run_and_a_generous_one_runs(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path / "cache"))  # nothing compiled yet
    io = sample_path("gelu_chain").with_suffix(".io.npz")
    argv = ["run", sample_path("gelu_chain"), "--backend", "cpu", "--inputs", io, "--outputs", tmp_path / "o.npz"]
    code, _, err = run_cli(capsys, *argv, "--time-limit", "0.01")
    assert_one_line_error(code, err, "the C compile of", "within the 0.01 s time limit", "--time-limit SECONDS")
    # Nothing half-built is cached (the host probe's own libraries, built while planning for the fresh
    # cache's host device, are whole).
    assert not [p for p in (tmp_path / "cache" / "cc").glob("*.so") if not p.name.startswith("host_probe")]
    assert not (tmp_path / "o.npz").exists()
    code, _, err = run_cli(capsys, *argv, "--time-limit", "300")
    assert code == 0, err
    before = (tmp_path / "o.npz").read_bytes()
    assert max_rel_error(np.load(tmp_path / "o.npz")["y"], np.load(io)["y"]) <= 1e-4
    # Compiled now (a cache hit): the run itself, in its worker process, is what runs out of time.
    code, _, err = run_cli(capsys, *argv, "--time-limit", "0.01")
    assert_one_line_error(code, err, "the CPU run of", "within the 0.01 s time limit", "TILEWEAVE_TIME_LIMIT")
    assert (tmp_path / "o.npz").read_bytes() == before  # the earlier outputs are left as they were
    monkeypatch.setenv("TILEWEAVE_TIME_LIMIT", "0.01")
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, "the CPU run of", "within the 0.01 s time limit")


@pytest.mark.parametrize("backend, what", [("reference", "the reference run of"),
                                           ("cuda-sim", "the cuda-sim run of")])
def test_time_limit_stops_the_reference_and_emulator_runs(capsys, tmp_path, backend, what):
    io = sample_path("gelu_chain").with_suffix(".io.npz")
    argv = ["run", sample_path("gelu_chain"), "--backend", backend, "--inputs", io, "--outputs", tmp_path / "o.npz"]
    code, _, err = run_cli(capsys, *argv, "--time-limit", "0.01")
    assert_one_line_error(code, err, what, "within the 0.01 s time limit", "--time-limit")
    code, _, err = run_cli(capsys, *argv, "--time-limit", "300")
    assert code == 0, err
    assert max_rel_error(np.load(tmp_path / "o.npz")["y"], np.load(io)["y"]) <= 1e-4


def test_compile_time_limit_bounds_nvrtc_and_the_c_compiler(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path / "cache"))
    for target, what in (("cuda", "the NVRTC compile of"), ("c", "the C compile of")):
        out = tmp_path / target
        code, _, err = run_cli(capsys, "compile", sample_path("gelu_chain"), "--target", target, "-o", out,
                               "--time-limit", "0.01")
        assert_one_line_error(code, err, what, "within the 0.01 s time limit", "--time-limit")
        assert not out.exists() or not any(out.iterdir())
    code, _, err = run_cli(capsys, "compile", sample_path("gelu_chain"), "--target", "cuda", "-o", tmp_path / "cuda",
                           "--time-limit", "300")
    assert code == 0, err
    assert list((tmp_path / "cuda").glob("*.cubin"))


@pytest.mark.parametrize("value", ["0", "-2", "nan", "soon"])
def test_a_bad_time_limit_is_one_line(capsys, tmp_path, value):
    code, _, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cpu", "--time-limit", value,
                           "--outputs", tmp_path / "o.npz")
    assert_one_line_error(code, err, f"--time-limit '{value}' is not a time limit in seconds")


# Every command that writes a file, by its output option: (command, option, extra arguments).
WRITERS = [
    ("run", "--outputs", ()),
    ("plan", "--plan-out", ()),
    ("rprogram", "--out", ()),
    ("rprogram", "--trace", ()),
    ("partition", "--trace", ("--devices", "2")),
    ("export", "-o", ()),
    ("export", "--annotated-onnx", ()),
    ("tune", "--export-db", ()),
]


@pytest.mark.parametrize("command,flag,extra", WRITERS, ids=[f"{c}{f}" for c, f, _ in WRITERS])
def test_outputs_never_destroy_what_the_user_has(capsys, tmp_path, command, flag, extra):
    """An output option pointed at the model itself, or at an existing file of another kind, is refused
    in one line before any work, and the file is left byte for byte; an unwritable path is one line."""
    model = tmp_path / "m.onnx"
    model.write_bytes(sample_path("gelu_chain").read_bytes())
    before = model.read_bytes()
    code, _, err = run_cli(capsys, command, model, *extra, flag, model)
    assert_one_line_error(code, err, flag, "overwrite the input")
    assert model.read_bytes() == before
    notes = tmp_path / "notes.txt"
    notes.write_text("a user's file that is not an output of ours\n")
    code, _, err = run_cli(capsys, command, model, *extra, flag, notes)
    assert_one_line_error(code, err, flag, "exists and is not")
    assert notes.read_text() == "a user's file that is not an output of ours\n"
    for bad in (tmp_path / "missing" / "out", notes / "out"):
        code, _, err = run_cli(capsys, command, model, *extra, flag, bad)
        assert_one_line_error(code, err, flag)


def test_outputs_replace_an_earlier_output_whole(capsys, tmp_path, monkeypatch):
    """Re-running into the same --outputs file replaces it; a write that fails leaves the earlier file."""
    import engine.files as files

    model, out = sample_path("gelu_chain"), tmp_path / "o.npz"
    assert run_cli(capsys, "run", model, "--backend", "reference", "--outputs", out)[0] == 0
    first = out.read_bytes()
    assert run_cli(capsys, "run", model, "--backend", "reference", "--seed", "7", "--outputs", out)[0] == 0
    second = out.read_bytes()
    assert second != first

    def full_disk(fd, mode):
        os.close(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fdopen", full_disk)
    code, _, err = run_cli(capsys, "run", model, "--backend", "reference", "--seed", "8", "--outputs", out)
    assert_one_line_error(code, err, "--outputs", "No space left")
    assert out.read_bytes() == second
    assert [p.name for p in tmp_path.iterdir()] == ["o.npz"]


def test_run_profile_prints_measured_beside_modeled_per_kernel(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "run", sample_path("layernorm_residual"), "--backend", "cpu", "--policy",
                           "stitch", "--profile", "3", "--outputs", tmp_path / "o.npz")
    assert code == 0
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("profile: measured on CPU"))
    assert "median of 3 launches" in lines[head] and "modeled for host" in lines[head]
    rows = lines[head + 2:]
    kernels = [r for r in rows if r.startswith("k")]
    assert kernels and all(len(r.split()) == 3 and float(r.split()[1]) > 0 for r in kernels)
    total = next(r for r in rows if r.startswith("total (each kernel timed alone)"))
    measured = [float(r.split()[1]) for r in kernels]
    assert float(total.split()[-2]) == pytest.approx(sum(measured), abs=0.05 * len(measured) + 0.05)
    assert not any(r.startswith("whole program") for r in rows)  # back to back: the cuda backend only


@pytest.mark.parametrize("argv, says", [
    (("--backend", "reference", "--profile", "3"), "not --backend reference"),
    (("--backend", "cpu", "--profile", "-2"), "--profile must be a positive number of launches, got -2"),
])
def test_run_profile_refuses_what_it_cannot_time_in_one_line(capsys, tmp_path, argv, says):
    code, out, err = run_cli(capsys, "run", sample_path("gelu_chain"), *argv, "--outputs", tmp_path / "o.npz")
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.npz").exists()


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`tileweave ... | head`: the pipe closes under the command's output; it stops quietly (exit 141, as a tool
    killed by SIGPIPE), never with a BrokenPipeError traceback."""
    import subprocess
    import sys

    code = ("import engine.commands as c\n"
            "def closed(args):\n    raise BrokenPipeError(32, 'Broken pipe')\n"
            "c.cmd_info = closed\n"
            "from engine.cli import main\nimport sys\nsys.exit(main(['info', 'x.onnx']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert proc.returncode == 141 and "Traceback" not in proc.stderr, proc.stderr
