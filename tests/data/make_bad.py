"""Write the hostile corpus under tests/data/bad/: malformed or hostile ONNX models, plan JSON files,
kernel bundles and device files, plus MANIFEST.json naming for each file its kind and a phrase its
one-line refusal must contain. tests/test_hostile.py runs every file through the CLI and the app.

    python tests/data/make_bad.py        # rewrites tests/data/bad/ (deterministic)

Files stay small: a "huge shape" model declares the shape, it carries no data.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "bad"
PLAN_MODEL = ROOT / "samples" / "gelu_chain.onnx"  # the model every plan/bundle file is loaded against
OTHER_MODEL = ROOT / "samples" / "layernorm_residual.onnx"

ENTRIES: list[dict] = []


def add(name: str, kind: str, expect: str, data: bytes | str) -> None:
    """Write one file and record what its refusal must say."""
    path = OUT / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    ENTRIES.append({"file": name, "kind": kind, "expect": expect})


# ---- ONNX models ---------------------------------------------------------------------------------


def vi(name: str, elem: int = T.FLOAT, dims=(2, 3)):
    return helper.make_tensor_value_info(name, elem, list(dims))


def model(nodes, inputs, outputs, inits=(), *, opset: int | None = 17, ir: int = 10, name: str = "bad",
          opsets=None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    imports = opsets if opsets is not None else ([helper.make_opsetid("", opset)] if opset is not None else [])
    m = helper.make_model(graph, opset_imports=imports)
    m.ir_version = ir
    return m


def relu(**kw) -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu0")], [vi("x")], [vi("y")], **kw)


def add_model(name: str, expect: str, m: onnx.ModelProto) -> None:
    add(name, "model", expect, m.SerializeToString())


def const(name: str, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def external(location: str) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = T.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "24")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    return model([helper.make_node("Add", ["x", "w"], ["y"], name="add0")], [vi("x")], [vi("y")], [w])


def models() -> None:
    rng = np.random.default_rng(1234)
    add("garbage.onnx", "model", "not an ONNX file", rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    add("truncated.onnx", "model", "truncated or corrupt", PLAN_MODEL.read_bytes()[:200])
    add("empty.onnx", "model", "is empty", b"")
    add("text.onnx", "model", "not an ONNX", "this is not a model\n")
    add("json_model.onnx", "model", "not an ONNX", '{"graph": {"node": []}}')
    add("zeros.onnx", "model", "not an ONNX", bytes(1024))
    add_model("ir_version_0.onnx", "ir_version", relu(ir=0))
    add_model("ir_version_99.onnx", "ir_version", relu(ir=99))
    add_model("ir_version_2.onnx", "ir_version", relu(ir=2))
    add_model("opset_99.onnx", "opset 99", relu(opset=99))
    add_model("opset_5.onnx", "too old", relu(opset=5))
    add_model("opset_none.onnx", "opset", relu(opsets=[helper.make_opsetid("ai.onnx.ml", 3)]))
    add_model("cycle.onnx", "topologically sorted", model(
        [helper.make_node("Relu", ["b"], ["a"], name="r0"), helper.make_node("Relu", ["a"], ["b"], name="r1"),
         helper.make_node("Add", ["x", "a"], ["y"], name="add0")], [vi("x")], [vi("y")]))
    add_model("undefined_input.onnx", "nope", model(
        [helper.make_node("Add", ["x", "nope"], ["y"], name="add0")], [vi("x")], [vi("y")]))
    add_model("duplicate_output.onnx", "single static assignment", model(
        [helper.make_node("Relu", ["x"], ["y"], name="r0"), helper.make_node("Neg", ["x"], ["y"], name="n0")],
        [vi("x")], [vi("y")]))
    add_model("duplicate_input.onnx", "single static assignment", model(
        [helper.make_node("Relu", ["x"], ["y"], name="r0")], [vi("x"), vi("x")], [vi("y")]))
    add_model("output_never_produced.onnx", "ghost", model(
        [helper.make_node("Relu", ["x"], ["y"], name="r0")], [vi("x")], [vi("y"), vi("ghost")]))
    add_model("wrong_topological_order.onnx", "topologically sorted", model(
        [helper.make_node("Neg", ["t"], ["y"], name="n0"), helper.make_node("Relu", ["x"], ["t"], name="r0")],
        [vi("x")], [vi("y")]))
    add_model("add_float_int64.onnx", "ONNX requires all inputs of type T to be one type", model(
        [helper.make_node("Add", ["a", "b"], ["y"], name="add0")], [vi("a"), vi("b", T.INT64)], [vi("y")]))
    add_model("matmul_float_int32.onnx", "one type", model(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm0")], [vi("a", dims=(2, 3)),
                                                                    vi("b", T.INT32, (3, 2))], [vi("y", dims=(2, 2))]))
    add_model("concat_mixed_types.onnx", "one type", model(
        [helper.make_node("Concat", ["a", "b"], ["y"], name="cat0", axis=0)], [vi("a"), vi("b", T.FLOAT16)],
        [vi("y", dims=(4, 3))]))
    add_model("relu_on_bool.onnx", "does not take", model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu0")], [vi("x", T.BOOL)], [vi("y", T.BOOL)]))
    add_model("where_float_condition.onnx", "condition", model(
        [helper.make_node("Where", ["c", "a", "b"], ["y"], name="where0")], [vi("c"), vi("a"), vi("b")], [vi("y")]))
    add_model("concat_axis_out_of_range.onnx", "axis", model(
        [helper.make_node("Concat", ["a", "b"], ["y"], name="cat0", axis=7)], [vi("a"), vi("b")],
        [vi("y", dims=(4, 3))]))
    add_model("softmax_axis_out_of_range.onnx", "axis", model(
        [helper.make_node("Softmax", ["x"], ["y"], name="sm0", axis=-9)], [vi("x")], [vi("y")]))
    add_model("transpose_bad_perm.onnx", "perm", model(
        [helper.make_node("Transpose", ["x"], ["y"], name="tr0", perm=[0, 0])], [vi("x")], [vi("y", dims=(3, 2))]))
    add_model("gather_axis_out_of_range.onnx", "axis", model(
        [helper.make_node("Gather", ["x", "i"], ["y"], name="g0", axis=5)], [vi("x")], [vi("y", dims=(2,))],
        [const("i", [0, 1])]))
    add_model("gather_index_out_of_range.onnx", "out of range", model(
        [helper.make_node("Gather", ["w", "i"], ["y"], name="g0", axis=0)], [vi("x")], [vi("y", dims=(2, 3))],
        [const("i", [0, 99]), numpy_helper.from_array(np.ones((2, 3), np.float32), "w")]))
    add_model("reshape_wrong_count.onnx", "6 elements", model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="rs0")], [vi("x")], [vi("y", dims=(4, 4))],
        [const("s", [4, 4])]))
    add_model("conv_kernel_larger_than_input.onnx", "window of 5", model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv0")], [vi("x", dims=(1, 1, 2, 2))],
        [vi("y", dims=(1, 1, 1, 1))], [numpy_helper.from_array(np.ones((1, 1, 5, 5), np.float32), "w")]))
    add_model("slice_step_zero.onnx", "step", model(
        [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"], name="sl0")], [vi("x")], [vi("y")],
        [const("s", [0]), const("e", [2]), const("a", [0]), const("st", [0])]))
    add_model("missing_required_attr.onnx", "axis", model(
        [helper.make_node("Concat", ["a", "b"], ["y"], name="cat0")], [vi("a"), vi("b")], [vi("y", dims=(4, 3))]))
    add_model("unknown_attribute.onnx", "bogus", model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu0", bogus=3)], [vi("x")], [vi("y")]))
    add_model("too_many_inputs.onnx", "input size 3", model(
        [helper.make_node("Add", ["a", "b", "c"], ["y"], name="add0")], [vi("a"), vi("b"), vi("c")], [vi("y")]))
    add_model("huge_input_shape.onnx", "memory budget", relu_of((200000, 200000, 64)))
    add_model("huge_shape_2_80.onnx", "memory budget", relu_of((1 << 40, 1 << 40)))
    add_model("negative_dim.onnx", "negative dimension -5", relu_of((-5, 3)))
    add_model("zero_dim.onnx", "--shape", relu_of((0, 3)))
    add_model("unbound_dynamic_dim.onnx", "--shape", relu_of(("batch", 3)))
    add_model("constant_of_shape_huge.onnx", "budget for constants", model(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], name="cos0",
                          value=numpy_helper.from_array(np.ones(1, np.float32))),
         helper.make_node("Add", ["x", "c"], ["y"], name="add0")],
        [vi("x", dims=(1,))], [vi("y", dims=(100000, 100000, 100))], [const("s", [100000, 100000, 100])]))
    add_model("expand_huge.onnx", "memory budget", model(
        [helper.make_node("Expand", ["x", "s"], ["y"], name="ex0")], [vi("x", dims=(1, 1))],
        [vi("y", dims=(1 << 20, 1 << 20))], [const("s", [1 << 20, 1 << 20])]))
    add_model("range_huge.onnx", "budget for constants", model(
        [helper.make_node("Range", ["a", "b", "d"], ["r"], name="rg0"),
         helper.make_node("Cast", ["r"], ["y"], name="c0", to=T.FLOAT)], [vi("x", dims=(1,))],
        [vi("y", dims=(10**12,))], [const("a", 0), const("b", 10**12), const("d", 1)]))
    add_model("initializer_no_data.onnx", "one and only one value field", model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add0")], [vi("x")], [vi("y")],
        [_declared_only("w", [1000000, 1000000])]))
    add_model("complex_input.onnx", "COMPLEX64", relu_of((2, 3), T.COMPLEX64))
    add_model("string_input.onnx", "STRING", model(
        [helper.make_node("Identity", ["x"], ["y"], name="id0")], [vi("x", T.STRING)], [vi("y", T.STRING)]))
    seq = helper.make_tensor_sequence_value_info("x", T.FLOAT, [2])
    add_model("sequence_input.onnx", "not a tensor", model(
        [helper.make_node("SequenceLength", ["x"], ["y"], name="sl0")], [seq], [vi("y", T.INT64, ())]))
    add_model("custom_domain_op.onnx", "custom domain", model(
        [helper.make_node("Frobnicate", ["x"], ["y"], name="f0", domain="com.evil")], [vi("x")], [vi("y")],
        opsets=[helper.make_opsetid("", 17), helper.make_opsetid("com.evil", 1)]))
    add_model("unsupported_op.onnx", "not supported", model(
        [helper.make_node("Det", ["x"], ["y"], name="det0")], [vi("x", dims=(3, 3))], [vi("y", dims=())]))
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t")])
    add_model("if_subgraph.onnx", "If", model(
        [helper.make_node("If", ["c"], ["y"], name="if0", then_branch=then, else_branch=then)],
        [vi("x"), vi("c", T.BOOL, ())], [vi("y")]))
    add_model("external_dotdot.onnx", "outside the model's folder", external("../../secret.bin"))
    add_model("external_absolute.onnx", "outside the model's folder", external("/etc/hostname"))
    add_model("external_symlink.onnx", "outside the model's folder", external("ext_link.bin"))
    add_model("external_missing.onnx", "missing", external("no_such_weights.bin"))
    link = OUT / "ext_link.bin"
    link.unlink(missing_ok=True)
    os.symlink("/etc/hostname", link)  # committed as a symlink: the importer must not follow it out


def _declared_only(name: str, dims) -> onnx.TensorProto:
    """An initializer that declares `dims` and carries no data at all."""
    t = onnx.TensorProto()
    t.name, t.data_type = name, T.FLOAT
    t.dims.extend(dims)
    return t


def relu_of(dims, elem: int = T.FLOAT) -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu0")], [vi("x", elem, dims)], [vi("y", elem, dims)])


# ---- plans -----------------------------------------------------------------------------------------


def good_plan(path: Path = PLAN_MODEL, policy: str = "stitch") -> dict:
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model
    from engine.schedule.plan import plan_to_json

    return plan_to_json(plan_model(load_graph(path), policy, "a100")[1])


def plans() -> dict:
    plan = good_plan()
    text = json.dumps

    def variant(change) -> str:
        d = json.loads(text(plan))
        change(d)
        return text(d)

    def tile(key, value):
        def change(d):
            d["groups"][0]["segments"][0][key] = value
        return change

    add("plan_garbage.plan.json", "plan", "not valid JSON", b"\x00\x01{{{{")
    add("plan_not_utf8.plan.json", "plan", "UTF-8", b'{"schema": "\xff\xfe"}')
    add("plan_array.plan.json", "plan", "not a tileweave plan", "[1, 2, 3]")
    add("plan_no_schema.plan.json", "plan", "no 'schema'", variant(lambda d: d.pop("schema")))
    add("plan_schema_99.plan.json", "plan", "schema version 99", variant(lambda d: d.update(schema=99)))
    add("plan_unknown_key.plan.json", "plan", "unknown key 'rogue'", variant(lambda d: d.update(rogue=1)))
    add("plan_other_model.plan.json", "plan", "not this one", text(good_plan(OTHER_MODEL)))
    add("plan_no_model_hash.plan.json", "plan", "not this one", variant(lambda d: d.pop("model_hash")))
    add("plan_bad_conn.plan.json", "plan", "teleport",
        variant(lambda d: d["edges"][0].update(conn="teleport") if d["edges"] else d.update(rogue=1)))
    add("plan_negative_threads.plan.json", "plan", "threads must be an integer", variant(tile("threads", -32)))
    add("plan_huge_threads.plan.json", "plan", "threads per block (limit 1024)", variant(tile("threads", 10**9)))
    add("plan_zero_tile.plan.json", "plan", "shape must be an integer", variant(tile("shape", [0, 0])))
    add("plan_string_tile.plan.json", "plan", "shape must be a list", variant(tile("shape", "big")))
    add("plan_unknown_tile_key.plan.json", "plan", "malformed plan", variant(tile("warp_magic", 1)))
    add("plan_no_edges.plan.json", "plan", "malformed plan", variant(lambda d: d.pop("edges")))
    add("plan_unknown_edit.plan.json", "plan", "unknown kind 'explode'", variant(
        lambda d: d.update(policy="user", base_policy="stitch", edits=[{"kind": "explode", "args": {}}])))
    add("plan_deep_nesting.plan.json", "plan", "nested too deeply", "[" * 5000 + "]" * 5000)
    add("plan_infinity.plan.json", "plan", "schedule_seconds", variant(lambda d: d.update(schedule_seconds=float("inf"))))
    return plan


# ---- bundles ---------------------------------------------------------------------------------------


def zip_bytes(files: dict[str, bytes], *, manifest: bool = True, links: tuple[str, ...] = ()) -> bytes:
    files = dict(files)
    if manifest:
        files["manifest.json"] = json.dumps(
            {"name": "bad", "kernels": 1, "archs": ["sm_80"],
             "sha256": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            if name in links:
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, data)
    return buf.getvalue()


def bundles(plan: dict) -> None:
    ok = {"plan.json": json.dumps(plan).encode()}
    add("bundle_zip_slip.zip", "bundle", "outside the bundle", zip_bytes(ok | {"../../evil.txt": b"pwned"}))
    add("bundle_absolute.zip", "bundle", "outside the bundle", zip_bytes(ok | {"/tmp/tileweave_evil.txt": b"x"}))
    add("bundle_backslash.zip", "bundle", "outside the bundle", zip_bytes(ok | {"..\\..\\evil.txt": b"x"}))
    add("bundle_symlink.zip", "bundle", "symbolic link", zip_bytes(ok | {"c/link": b"/etc/passwd"}, links=("c/link",)))
    add("bundle_not_zip.zip", "bundle", "not a zip", b"PK\x03\x04 not really a zip archive at all")
    full = zip_bytes(ok)
    add("bundle_truncated.zip", "bundle", "not a zip", full[: len(full) // 2])
    add("bundle_no_manifest.zip", "bundle", "no manifest.json", zip_bytes(ok, manifest=False))
    bad_hash = zip_bytes(ok)
    add("bundle_hash_mismatch.zip", "bundle", "does not match its manifest hash", _tamper(bad_hash))
    add("bundle_no_plan.zip", "bundle", "no plan.json", zip_bytes({"README.md": b"hi"}))
    add("bundle_other_model.zip", "bundle", "not this one",
        zip_bytes({"plan.json": json.dumps(good_plan(OTHER_MODEL)).encode()}))
    add("bundle_duplicate_entry.zip", "bundle", "appears twice", _duplicate(ok))
    add("bundle_zip_bomb.zip", "bundle", "zip bomb", zip_bytes(ok | {"weights.npz": bytes(257 << 20)}))


def _tamper(data: bytes) -> bytes:
    """Rewrite plan.json after the manifest was hashed."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        files = {n: z.read(n) for n in z.namelist()}
    files["plan.json"] = files["plan.json"].replace(b'"stitch"', b'"unfused"', 1) + b" "
    return zip_bytes(files, manifest=False)


def _duplicate(files: dict[str, bytes]) -> bytes:
    data = zip_bytes(files)
    buf = io.BytesIO(data)
    import warnings

    with warnings.catch_warnings(), zipfile.ZipFile(buf, "a") as z:
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name: that is the point
        z.writestr("plan.json", b"{}")
    return buf.getvalue()


# ---- device files ------------------------------------------------------------------------------------


def devices() -> None:
    add("device_sm_count_huge.toml", "device", "'sm_count'", 'base = "a100"\nsm_count = 1000000000000\n')
    add("device_negative_bw.toml", "device", "'dram_bw_bytes_per_s'", 'base = "a100"\ndram_bw_bytes_per_s = -1e12\n')
    add("device_nan.json", "device", "finite", '{"base": "a100", "clock_hz": NaN}')
    add("device_infinity.json", "device", "finite", '{"base": "a100", "peak_fp32_flops": Infinity}')
    add("device_string_figure.toml", "device", "'sm_count'", 'base = "a100"\nsm_count = "lots"\n')
    add("device_warp_1.toml", "device", "'warp_size'", 'base = "a100"\nwarp_size = 1\nmax_threads_per_block = 32\n')
    add("device_memory_float.toml", "device", "'memory_bytes'", 'base = "a100"\nmemory_bytes = 1e30\n')
    add("device_memory_huge.toml", "device", "'memory_bytes'", 'base = "a100"\nmemory_bytes = 9000000000000000000\n')
    add("device_clock_petahertz.toml", "device", "'clock_hz'", 'base = "a100"\nclock_hz = 1.4e15\n')
    add("device_smem_exabyte.toml", "device", "smem", 'base = "a100"\nsmem_per_sm_bytes = 1000000000000000000\n')
    add("device_not_toml.toml", "device", "not valid TOML", "this = = is not toml [[[\n")
    add("device_binary.toml", "device", "not valid TOML", b"\xff\xfe\x00garbage")
    add("device_array.json", "device", "table/object", "[1, 2, 3]")
    add("device_unknown_base.toml", "device", "'base'", 'base = "b9000"\n')
    add("device_deep_nesting.json", "device", "nested", "[" * 5000 + "]" * 5000)
    add("device_unknown_key.toml", "device", "'sm_cuont'", 'base = "a100"\nsm_cuont = 80\n')
    add("device_missing_keys.toml", "device", "missing key", "sm_count = 80\n")


def main() -> int:
    sys.path.insert(0, str(ROOT))
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    models()
    plan = plans()
    bundles(plan)
    devices()
    manifest = {"plan_model": str(PLAN_MODEL.relative_to(ROOT)), "files": ENTRIES}
    (OUT / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    sizes = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"wrote {len(ENTRIES)} hostile files to {OUT} ({sizes / 1e6:.2f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
