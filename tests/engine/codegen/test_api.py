"""engine/codegen/api.py and the `tileweave compile` CLI: every kernel its own NVRTC unit with PTX and
CUBIN per arch, program.json naming each launch's files with hashes, buffers, bad input in one line.
Compile-only (no GPU); the shared disk cache keeps reruns cheap."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plans import policy_plan  # noqa: E402
from sample_io import RUNNABLE, SAMPLES, load_sample  # noqa: E402

from engine.cli import main  # noqa: E402
from engine.codegen import api  # noqa: E402
from engine.codegen.api import compile_program, kernel_units, write_compiled  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.errors import CompileError, UnsupportedOpError  # noqa: E402

ARCHS = ("sm_80", "sm_90")


def _program(name: str, policy: str = "welder"):
    try:
        graph = load_sample(name)[0]
    except UnsupportedOpError as err:
        pytest.skip(f"frontend does not convert {name} yet: {err}")
    return generate(policy_plan(graph, policy), graph)


def _check_file(out: Path, entry: dict) -> bytes:
    data = (out / entry["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["file"]
    return data


@pytest.mark.parametrize("name", RUNNABLE)
def test_every_welder_kernel_compiles_alone_for_sm80_and_sm90(name, tmp_path):
    program = _program(name)
    compiled = compile_program(program, "cuda", archs=ARCHS)
    write_compiled(program, compiled, tmp_path)
    meta = json.loads((tmp_path / "program.json").read_text())
    assert meta["archs"] == list(ARCHS) and meta["arch"] == "sm_80" and meta["target"] == "cuda"
    assert (tmp_path / meta["source"]).read_text() == compiled.source
    kernels = {k.name for k in program.kernels}
    assert [k["name"] for k in meta["kernels"]] == [k.name for k in program.kernels]
    assert len(meta["launches"]) == len(program.launches)
    for item in meta["kernels"] + meta["launches"]:
        kernel = item.get("kernel", item.get("name"))
        unit = _check_file(tmp_path, item["source"]).decode()
        # The unit defines this kernel and no other one.
        assert re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", unit) == [kernel]
        assert set(item["binaries"]) == set(ARCHS)
        for arch, files in item["binaries"].items():
            ptx = _check_file(tmp_path, files["ptx"]).decode()
            cubin = _check_file(tmp_path, files["cubin"])
            assert re.findall(r"\.entry (\w+)\(", ptx) == [kernel] and f".target {arch}" in ptx
            assert cubin[:4] == b"\x7fELF" and kernel.encode() in cubin
    for ln, launch in zip(meta["launches"], program.launches):
        assert ln["kernel"] in kernels
        assert (ln["grid"], ln["block"], ln["shared_bytes"], ln["cooperative"], ln["args"]) == (
            launch.grid, launch.block, launch.shared_bytes, launch.cooperative, list(launch.args))
    written = {p.name for p in tmp_path.iterdir()}
    assert written == {meta["source"], "program.json"} | {
        f"{k}{suffix}" for k in kernels for suffix in (".cu", *(f".{a}.{x}" for a in ARCHS for x in ("ptx", "cubin")))}


def test_buffers_list_every_argument_with_arena_offsets():
    program = _program("bert_layer")
    compiled = compile_program(program, "cuda", archs=("sm_80",))
    meta = api.program_json(program, compiled, api.compiled_files(program, compiled))
    buffers = {b["tensor"]: b for b in meta["buffers"]}
    assert set(buffers) == {t for ln in program.launches for t in ln.args}
    arena = meta["memory"]["arena_bytes"]
    assert 0 < arena < meta["memory"]["naive_bytes"]  # bert_layer reuses arena space
    for b in buffers.values():
        if b["role"] == "intermediate":
            assert b["offset"] is not None and b["offset"] + b["nbytes"] <= arena
        else:
            assert b["offset"] is None
    roles = {b["role"] for b in buffers.values()}
    assert roles == {"input", "constant", "output", "intermediate"}
    assert [b["tensor"] for b in meta["buffers"] if b["role"] == "output"] == list(program.outputs)


def test_kernel_units_carry_the_prelude_and_only_the_helpers_they_call():
    from engine.codegen.targets import CUDA_HEADER

    program = _program("bert_layer", "unfused")  # one of its kernels calls imin/imax, the others nothing
    whole = api.render_cuda(program)
    units = dict(kernel_units(program))
    assert list(units) == [k.name for k in program.kernels]
    helpers = [_helpers(u) for u in units.values()]
    assert _helpers(whole) and set().union(*helpers) == _helpers(whole)
    assert any(h < _helpers(whole) for h in helpers)
    chunks = {c.split(":")[0][3:]: c.strip() for c in re.split(r"\n(?=// \w+: stages)", whole)[1:]}
    for name, unit in units.items():
        assert unit.startswith(CUDA_HEADER) and chunks[name] in unit


def _helpers(source: str) -> set[str]:
    return set(re.findall(r"^__device__ __forceinline__ \w+ (\w+)\(", source, re.MULTILINE))


def test_a_failing_kernel_is_named_with_the_command_to_reproduce(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    program = _program("layernorm_residual")
    bad = program.kernels[-1].name
    render = api.render_cuda

    def broken(p):
        source = render(p)
        return source.replace(") {", ") {\n    float y = ;", 1) if [k.name for k in p.kernels] == [bad] else source

    monkeypatch.setattr(api, "render_cuda", broken)
    with pytest.raises(CompileError) as info:
        compile_program(program, "cuda", archs=ARCHS)
    message = str(info.value)
    assert f"kernel {bad} failed to compile for sm_80" in message and "\n" not in message
    assert "error" in message and "python -m engine.codegen.nvrtc" in message
    assert info.value.source_path.name.startswith(bad)


def test_compile_cli_lists_what_it_writes(tmp_path, capsys):
    out = tmp_path / "new" / "dir"
    assert main(["compile", str(SAMPLES / "layernorm_residual.onnx"), "--target", "cuda",
                 "--arch", "sm_80", "--arch", "sm_90", "-o", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    listed = {w for line in printed if line.startswith("  ") for w in line.split()}  # the indented listing
    files = {p.name for p in out.iterdir()}
    assert listed == files
    # The plan's modeled time at the registers NVRTC gave the device's arch (sm_80 for a100), beside the formula's.
    assert any(line.startswith("modeled ") and "compiled for sm_80 (formula: " in line for line in printed), printed
    meta = json.loads((out / "program.json").read_text())
    assert meta["archs"] == ["sm_80", "sm_90"]
    for k in meta["kernels"]:
        assert {f"{k['name']}.cu", f"{k['name']}.sm_80.ptx", f"{k['name']}.sm_90.cubin"} <= files
    # --target c: the C source and program.json, no binaries.
    out_c = tmp_path / "c"
    assert main(["compile", str(SAMPLES / "layernorm_residual.onnx"), "--target", "c", "-o", str(out_c)]) == 0
    assert {p.name for p in out_c.iterdir()} == {"layernorm_residual.c", "program.json"}
    meta_c = json.loads((out_c / "program.json").read_text())
    assert meta_c["target"] == "c" and meta_c["archs"] == [] and meta_c["buffers"]
    # Again into the same folder: an earlier output is replaced; a user's file of the same name is not.
    assert main(["compile", str(SAMPLES / "layernorm_residual.onnx"), "--target", "c", "-o", str(out_c)]) == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "layernorm_residual.c").write_text("/* the user's own */\n")
    capsys.readouterr()
    assert main(["compile", str(SAMPLES / "layernorm_residual.onnx"), "--target", "c", "-o", str(mine)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already has layernorm_residual.c" in err[0], err
    assert (mine / "layernorm_residual.c").read_text() == "/* the user's own */\n"
    assert [p.name for p in mine.iterdir()] == ["layernorm_residual.c"]


@pytest.mark.parametrize("args, words", [
    (["--target", "ptx"], "unknown target 'ptx'"),
    (["--target", "c", "--arch", "sm_80"], "--arch applies to --target cuda only"),
    (["--arch", "sm_70"], "sm_70 is not supported"),
    (["-o", "{file}"], "it is a file"),
    (["-o", "{file}/sub"], "is a file"),
])
def test_compile_cli_bad_input_is_one_line(args, words, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    args = [a.replace("{file}", str(afile)) for a in args]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "out")]
    assert main(["compile", str(SAMPLES / "gelu_chain.onnx"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    assert not (tmp_path / "out").exists()


def test_compile_help_says_what_is_written(capsys):
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("KERNEL.ARCH.ptx", "KERNEL.ARCH.cubin", "program.json", "sha256", "arena", "--arch"):
        assert words in text


def test_changing_one_kernel_recompiles_only_that_kernel(monkeypatch, tmp_path):
    from engine.codegen import nvrtc

    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    program = _program("layernorm_residual", "elementwise")
    assert len(program.kernels) > 1
    compile_program(program, "cuda", archs=ARCHS)
    changed = program.kernels[0].name
    render, run, calls = api.render_cuda, nvrtc._run_nvrtc, []

    def edited(p):
        return render(p) + ("// edited\n" if [k.name for k in p.kernels] == [changed] else "")

    def counted(source, name, options):
        calls.append(name)
        return run(source, name, options)

    monkeypatch.setattr(api, "render_cuda", edited)
    monkeypatch.setattr(nvrtc, "_run_nvrtc", counted)
    compile_program(program, "cuda", archs=ARCHS)
    assert calls == [changed, changed]  # once per arch; every other unit is a cache hit


def test_cooperative_grids_are_refit_to_the_compiled_registers():
    # Before NVRTC the grid of a kernel with grid barriers is capped by threads and shared memory alone;
    # after it, by the registers its CUBIN uses (modeled for the plan's device; a GPU asks its driver).
    from engine.device import get_device, wave_grid

    program = _program("layernorm_residual", "stitch")
    device = get_device("a100")
    coop = [ln for ln in program.launches if ln.cooperative]
    assert coop
    compiled = compile_program(program, "cuda", archs=("sm_80",))
    fitted = api.fit_launches(program, compiled, device)
    units = {k.name: k for k in compiled.kernels}
    for before, after in zip(program.launches, fitted.launches):
        kernel = program.kernel(before.kernel)
        if not before.cooperative:
            assert after == before
            continue
        used = units[kernel.name].binaries[0].resources(kernel.name)
        assert used.registers > 0
        assert after.grid == wave_grid(device, kernel.ntiles, kernel.threads, used.registers,
                                       kernel.shared_bytes + used.static_shared_bytes)[0]
        assert before.grid == wave_grid(device, kernel.ntiles, kernel.threads, 0, kernel.shared_bytes)[0]
        assert after.grid <= before.grid
    meta = api.program_json(fitted, compiled, api.compiled_files(fitted, compiled))
    assert [ln["tiles"] for ln in meta["launches"]] == [program.kernel(ln.kernel).ntiles for ln in program.launches]
    assert all(ln["grid_source"].startswith("modeled") == ln["cooperative"] for ln in meta["launches"])
