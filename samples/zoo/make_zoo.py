"""Export the zoo (models.py) to ONNX with torch's exporter: `<name>.onnx`, `<name>.io.npz` (fixed-seed
inputs + onnxruntime outputs) and `catalog.json`. Runs in the generation venv (README.md), not tileweave's.

    /work/genvenv/bin/python samples/zoo/make_zoo.py [--only bert,vit] [--exporter dynamo|torchscript]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # keep samples/zoo/ free of __pycache__
from models import ZOO, ZooModel  # noqa: E402

MAX_IR_VERSION = 10  # onnxruntime 1.31 loads IR 10 models of every opset the exporters write
TORCHSCRIPT_OPSET = 17


def randomize_constants(model: torch.nn.Module, seed: int) -> None:
    """Random init leaves biases at 0, norm scales at 1, layer scales at 1e-6 and BatchNorm statistics at
    0/1: values that hide a wrongly indexed bias or scale. Every constant-initialised tensor gets noise."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() == 1 or float(p.std()) == 0.0:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))


def export(entry: ZooModel, model: torch.nn.Module, inputs: dict[str, torch.Tensor], exporter: str) -> tuple:
    """(ModelProto, exporter used, why the dynamo exporter was not used or '')."""
    args = tuple(inputs.values())
    names = dict(input_names=list(inputs), output_names=list(entry.outputs))
    why = ""
    if exporter == "dynamo":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opset = {"opset_version": entry.opset} if entry.opset else {}
                program = torch.onnx.export(model, args, dynamo=True, verbose=False, **names, **opset)
            proto = program.model_proto
            ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
            return proto, "dynamo", ""
        except Exception as err:  # the exporter's failures have no common type
            why = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}"
            print(f"  dynamo export failed ({why}); TorchScript exporter instead", flush=True)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, buf, dynamo=False, opset_version=TORCHSCRIPT_OPSET, **names)
    return onnx.load_from_string(buf.getvalue()), "torchscript", why


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def make_one(entry: ZooModel, exporter: str) -> dict:
    torch.manual_seed(0)
    model, inputs = entry.build(torch.Generator().manual_seed(1))
    randomize_constants(model, seed=2)
    model.eval()
    with torch.no_grad():
        want = model(*inputs.values())
    want = want if isinstance(want, tuple) else (want,)
    proto, used, why = export(entry, model, inputs, exporter)
    if proto.ir_version > MAX_IR_VERSION:
        proto.ir_version = MAX_IR_VERSION
    onnx.checker.check_model(proto, full_check=True)
    # The exporter's proto serializes in an order that varies run to run; a parsed copy does not.
    data = onnx.load_from_string(proto.SerializeToString()).SerializeToString(deterministic=True)
    (HERE / f"{entry.name}.onnx").write_bytes(data)

    feeds = {k: to_numpy(v) for k, v in inputs.items()}
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(out_names, sess.run(out_names, feeds)))
    for k, v in feeds.items():
        assert np.any(v != 0), f"{entry.name}: input {k} is all zeros"
    torch_err = max(float(np.abs(outs[n] - to_numpy(t)).max() / max(np.abs(to_numpy(t)).max(), 1e-30))
                    for n, t in zip(out_names, want))
    with open(HERE / f"{entry.name}.io.npz", "wb") as f:
        np.savez(f, **feeds, **outs)
    ort_ms = _time_ort(data, feeds)

    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    params = sum(int(np.prod(t.dims)) for t in proto.graph.initializer)
    return {
        "name": entry.name, "family": entry.family, "file": f"{entry.name}.onnx", "io": f"{entry.name}.io.npz",
        "description": entry.description, "exporter": used, "dynamo_failure": why,
        "opset": opset, "ir_version": proto.ir_version,
        "op_histogram": dict(sorted(Counter(n.op_type for n in proto.graph.node).items())),
        "nodes": len(proto.graph.node), "params": params,
        "inputs": [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()],
        "outputs": [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype)} for k, v in outs.items()],
        "bytes": len(data), "io_bytes": (HERE / f"{entry.name}.io.npz").stat().st_size,
        "ort_vs_torch_max_rel_err": float(f"{torch_err:.3g}"),
        "ort_ms_at_export": round(ort_ms, 3),
    }


def _time_ort(data: bytes, feeds: dict) -> float:
    """Median ms of onnxruntime (ORT_ENABLE_ALL, 2 threads): the size budget's check, not a benchmark."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model names (default: all)")
    parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo",
                        help="exporter to try first (dynamo falls back to torchscript per model)")
    args = parser.parse_args(argv)
    names = [m.name for m in ZOO]
    only = [n for n in args.only.split(",") if n] or names
    unknown = sorted(set(only) - set(names))
    if unknown:
        print(f"error: unknown zoo model(s) {', '.join(unknown)} (have {', '.join(names)})", file=sys.stderr)
        return 2
    catalog_path = HERE / "catalog.json"
    old = {e["name"]: e for e in json.loads(catalog_path.read_text())} if catalog_path.exists() else {}
    failed = []
    for entry in ZOO:
        if entry.name not in only:
            continue
        print(f"{entry.name}: exporting", flush=True)
        try:
            old[entry.name] = make_one(entry, args.exporter)
        except Exception:
            traceback.print_exc()
            failed.append(entry.name)
            continue
        e = old[entry.name]
        print(f"  {e['exporter']}, opset {e['opset']}, {e['nodes']} nodes, {e['params']:,} params, "
              f"{e['bytes'] / 1e6:.2f} MB, ort {e['ort_ms_at_export']:.2f} ms, "
              f"ort vs torch {e['ort_vs_torch_max_rel_err']:.1e}", flush=True)
    catalog = [old[n] for n in names if n in old]
    catalog_path.write_text(json.dumps(catalog, indent=1) + "\n")
    total = sum((HERE / e["file"]).stat().st_size + (HERE / e["io"]).stat().st_size for e in catalog)
    print(f"catalog: {len(catalog)} models, {total / 1e6:.1f} MB with I/O")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
