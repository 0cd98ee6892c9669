"""Real models at their published sizes, for `tileweave bench`: bert-base and gpt2-small (128 tokens), vit-base
and resnet50 (224 x 224), each built from its transformers config's defaults with random weights (seed 0),
exported with torch's dynamo exporter at opset 20 (weights as external data beside the .onnx), and onnxruntime's
output saved beside it as MODEL.io.npz (the inputs and `y`), as the zoo's are. Too big to commit (100-440 MB
each) and slow to plan for the test suite: the zoo (samples/zoo) holds the small configs; these are what
benchmarks/NOTES.md "fullsize" measured. Run it in the generation venv (samples/zoo/requirements-gen.txt):

    /work/genvenv/bin/python benchmarks/export_fullsize.py OUT_DIR [bertbase gpt2small vitbase resnet50]

bert-base's ids have dynamic batch and sequence axes (bind them with --shape input_ids=1,128 --shape
attention_mask=1,128, or let the .io.npz's arrays bind them); the others are exported at fixed shapes.
"""

from __future__ import annotations

import sys
from pathlib import Path

MODELS = ("bertbase", "gpt2small", "vitbase", "resnet50")


def build(name: str):
    """(module, inputs, dynamic_shapes) of one model."""
    import torch
    import transformers

    torch.manual_seed(0)

    class First(torch.nn.Module):
        def __init__(self, model, pick):
            super().__init__()
            self.model, self.pick = model, pick

        def forward(self, *args):
            return self.pick(self.model, *args)

    if name == "bertbase":
        cfg = transformers.BertConfig()
        cfg._attn_implementation = "eager"
        ids = torch.randint(0, cfg.vocab_size, (1, 128))
        mask = torch.ones(1, 128, dtype=torch.int64)
        mask[0, 100:] = 0  # padded tokens: the attention mask matters
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=512)
        model = First(transformers.BertModel(cfg), lambda m, i, a: m(input_ids=i, attention_mask=a).last_hidden_state)
        return model, {"input_ids": ids, "attention_mask": mask}, ({0: batch, 1: seq}, {0: batch, 1: seq})
    if name == "gpt2small":
        cfg = transformers.GPT2Config()
        cfg._attn_implementation = "eager"
        cfg.use_cache = False
        model = First(transformers.GPT2Model(cfg), lambda m, i: m(input_ids=i, use_cache=False).last_hidden_state)
        return model, {"input_ids": torch.randint(0, cfg.vocab_size, (1, 128))}, None
    if name == "vitbase":
        cfg = transformers.ViTConfig()
        cfg._attn_implementation = "eager"
        model = First(transformers.ViTModel(cfg), lambda m, x: m(pixel_values=x).last_hidden_state)
        return model, {"pixel_values": torch.randn(1, 3, 224, 224)}, None
    if name == "resnet50":
        model = First(transformers.ResNetModel(transformers.ResNetConfig()), lambda m, x: m(pixel_values=x).pooler_output)
        return model, {"pixel_values": torch.randn(1, 3, 224, 224)}, None
    raise SystemExit(f"unknown model {name!r}: choose from {', '.join(MODELS)}")


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:] or MODELS:
        model, inputs, dynamic = build(name)
        model.eval()
        program = torch.onnx.export(model, tuple(inputs.values()), dynamo=True, opset_version=20,
                                    input_names=list(inputs), output_names=["y"], dynamic_shapes=dynamic)
        proto = program.model_proto
        proto.ir_version = min(proto.ir_version, 10)  # onnxruntime 1.31 loads IR 10
        path = out / f"{name}.onnx"
        onnx.save(proto, path, save_as_external_data=True, location=f"{name}.onnx.data")
        feeds = {k: v.numpy() for k, v in inputs.items()}
        y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.savez(path.with_suffix(".io.npz"), **feeds, y=y)
        print(f"{name}: {path} ({sum(1 for _ in proto.graph.node)} nodes), y {tuple(y.shape)}", flush=True)


if __name__ == "__main__":
    main()
