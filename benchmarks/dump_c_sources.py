"""Write the generated C (and CUDA and OpenCL) of every sample and zoo model under every policy, planned for
each device, into a folder (one file per model x device x policy x printer, the error line where one
fails): run it on two commits and `diff -r` the folders to show a codegen refactor left the sources
byte-identical.

    PYTHONPATH=$PWD python benchmarks/dump_c_sources.py OUT [--devices host,a100] [--policies ...] [MODEL ...]

Per case: `plan_model` then `generate(..., target="c")` and `render_c`, as `tileweave compile --target c`
does; for a GPU device also the CUDA-target program printed as C (NAME.DEVICE.POLICY.cuda-program.c), as
the golden test and the DUMP_DIR trail print it, the CUDA source (NAME.DEVICE.POLICY.cu) and the OpenCL
source (NAME.DEVICE.POLICY.cl; its error line where the OpenCL printer refuses the program). MODEL is an
.onnx path or the name of a sample or zoo model (bert_layer, efficientnet); none given: every one of them."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def resolve_model(model: Path) -> Path | None:
    """`model` as given when it is a file, else the sample or zoo model of that name (samples/NAME.onnx,
    samples/zoo/NAME.onnx); None when there is none."""
    if model.is_file():
        return model
    for folder in (ROOT / "samples", ROOT / "samples" / "zoo"):
        candidate = folder / f"{model.stem}.onnx"
        if model.suffix in ("", ".onnx") and candidate.is_file():
            return candidate
    return None


def main(argv: list[str] | None = None) -> int:
    from engine.codegen.generate import generate
    from engine.codegen.opencl import render_opencl
    from engine.codegen.targets import render_c, render_cuda
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--devices", default="host,a100")
    p.add_argument("--policies", default="unfused,elementwise,stitch,welder")
    p.add_argument("models", nargs="*", type=Path)
    args = p.parse_intermixed_args(argv)  # models may follow the options
    models = [resolve_model(m) for m in args.models] or (sorted(ROOT.glob("samples/*.onnx"))
                                                         + sorted(ROOT.glob("samples/zoo/*.onnx")))
    if None in models:
        missing = next(m for m, r in zip(args.models, models) if r is None)
        print(f"error: no model '{missing}': give an .onnx path, or a name in samples/ or samples/zoo/ "
              "(e.g. bert_layer, efficientnet)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for model in models:
        tag = f"{model.parent.name}_{model.stem}"
        for dev in args.devices.split(","):
            device = get_device(dev)
            for policy in args.policies.split(","):
                t0 = time.perf_counter()
                outs = {}
                try:
                    graph, plan = plan_model(load_graph(model), policy, device)
                    outs["c"] = render_c(generate(plan, graph, device, target="c"))
                    if device.kind != "cpu":
                        program = generate(plan, graph, device, target="cuda")
                        outs["cuda-program.c"] = render_c(program)
                        outs["cu"] = render_cuda(program)
                        try:
                            outs["cl"] = render_opencl(program)
                        except Exception as err:  # noqa: BLE001 - e.g. float16 refused: compared too
                            outs["cl"] = f"error: {type(err).__name__}: {err}\n"
                except Exception as err:  # noqa: BLE001 - the error is part of what is compared
                    outs["c"] = f"error: {type(err).__name__}: {err}\n"
                for ext, text in outs.items():
                    (args.out / f"{tag}.{dev}.{policy}.{ext}").write_text(text)
                print(f"{tag:28} {dev:5} {policy:12} {time.perf_counter() - t0:6.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
