"""A wider net than the zoo, not committed as models: export more transformers architectures (small configs,
random init, fixed seeds) at opsets 20 and 23 into a folder, then check tileweave's import and reference
executor against onnxruntime on each. The zoo holds what the tests and benchmarks run on; this finds what a
user's next export would hit (an op the frontend lacks, a pattern it lowers wrong).

    /work/genvenv/bin/python samples/zoo/sweep.py export DIR [--only t5enc,qwen2]   # generation venv
    .venv/bin/python samples/zoo/sweep.py check DIR [--backends reference,cpu,cuda-sim]   # tileweave's venv

`export` writes DIR/<name>_o<opset>.onnx and .io.npz (inputs and onnxruntime's output `y`) and prints
each export's ops, or why the exporter failed; `check` prints OK/BAD/FAIL per model (and per backend: the
reference executor by default; cpu and cuda-sim run the welder plan, the C code and the CUDA code under the
SIMT emulator) with the relative error or the one-line error tileweave gave, and exits 1 when any is BAD or
FAIL.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

OPSETS = (20, 23)


def _catalog():
    import torch
    import transformers as T

    def ids(n: int = 16):
        # Two sequences, the second padded at its end: the mask goes through the graph into the attention.
        mask = torch.ones(2, n, dtype=torch.int64)
        mask[1, n - 5:] = 0
        return {"input_ids": torch.randint(0, 100, (2, n), generator=torch.Generator().manual_seed(1)),
                "attention_mask": mask}

    def img(size: int = 32):
        return {"pixel_values": torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))}

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    lm = dict(vocab_size=100, use_cache=False, **small)
    return {
        "distilbert": lambda: (T.DistilBertModel(T.DistilBertConfig(vocab_size=100, dim=32, hidden_dim=64,
                                                                    n_layers=2, n_heads=4)), ids()),
        "albert": lambda: (T.AlbertModel(T.AlbertConfig(vocab_size=100, embedding_size=16, **small)), ids()),
        "roberta": lambda: (T.RobertaModel(T.RobertaConfig(vocab_size=100, **small)), ids()),
        "convbert": lambda: (T.ConvBertModel(T.ConvBertConfig(vocab_size=100, embedding_size=32, **small)), ids()),
        "gptneox": lambda: (T.GPTNeoXModel(T.GPTNeoXConfig(**lm)), ids()),
        "qwen2": lambda: (T.Qwen2Model(T.Qwen2Config(num_key_value_heads=2, **lm)), ids()),
        "mistral": lambda: (T.MistralModel(T.MistralConfig(num_key_value_heads=2, sliding_window=8, **lm)), ids()),
        "phi": lambda: (T.PhiModel(T.PhiConfig(**lm)), ids()),
        # mixture-of-experts routing: a top-k of the router's softmax, each token's experts' weights gathered
        # (the batched_mm experts: the default grouped_mm is a custom op the exporter cannot translate)
        "mixtral": lambda: (T.MixtralModel(T.MixtralConfig(num_key_value_heads=2, num_local_experts=4,
                                                           num_experts_per_tok=2, experts_implementation="batched_mm",
                                                           **lm)), ids()),
        "qwen2moe": lambda: (T.Qwen2MoeModel(T.Qwen2MoeConfig(num_key_value_heads=2, num_experts=4,
                                                              num_experts_per_tok=2, moe_intermediate_size=32,
                                                              shared_expert_intermediate_size=32,
                                                              experts_implementation="batched_mm", **lm)), ids()),
        "opt": lambda: (T.OPTModel(T.OPTConfig(vocab_size=100, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                               num_attention_heads=4, word_embed_proj_dim=32)), ids()),
        "bloom": lambda: (T.BloomModel(T.BloomConfig(vocab_size=100, hidden_size=32, n_layer=2, n_head=4)), ids()),
        "t5enc": lambda: (T.T5EncoderModel(T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                      num_heads=4)), ids()),
        "wav2vec2": lambda: (T.Wav2Vec2Model(T.Wav2Vec2Config(conv_dim=(16, 16), conv_stride=(5, 2),
                                                              conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                                              num_conv_pos_embedding_groups=4, **small)),
                             {"input_values": torch.randn(1, 800, generator=torch.Generator().manual_seed(1))}),
        "clipvision": lambda: (T.CLIPVisionModel(T.CLIPVisionConfig(image_size=32, patch_size=8, **small)), img()),
        "deit": lambda: (T.DeiTModel(T.DeiTConfig(image_size=32, patch_size=8, **small)), img()),
        "dinov2": lambda: (T.Dinov2Model(T.Dinov2Config(image_size=32, patch_size=8, **small)), img()),
        "segformer": lambda: (T.SegformerModel(T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1],
                                                                 sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                                                 num_attention_heads=[1, 2], patch_sizes=[7, 3],
                                                                 strides=[4, 2], mlp_ratios=[2, 2])), img(64)),
        "regnet": lambda: (T.RegNetModel(T.RegNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                                        groups_width=4)), img()),
        "poolformer": lambda: (T.PoolFormerModel(T.PoolFormerConfig(hidden_sizes=[8, 16], depths=[1, 1],
                                                                    num_encoder_blocks=2, patch_sizes=[7, 3],
                                                                    strides=[4, 2], padding=[2, 1])), img()),
    }


def export(out: Path, only: list[str]) -> int:
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    class First(torch.nn.Module):
        """The model's last_hidden_state (or first output) as `y`."""

        def __init__(self, model, names):
            super().__init__()
            self.model, self.names = model, names

        def forward(self, *args):
            o = self.model(**dict(zip(self.names, args)))
            return o.last_hidden_state if hasattr(o, "last_hidden_state") else o[0]

    catalog = _catalog()
    unknown = sorted(set(only) - set(catalog))
    if unknown:
        print(f"error: unknown model(s) {', '.join(unknown)} (have {', '.join(catalog)})", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for name in only or list(catalog):
        for opset in OPSETS:
            torch.manual_seed(0)
            model, inputs = catalog[name]()
            model.eval()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    program = torch.onnx.export(First(model, list(inputs)), tuple(inputs.values()), dynamo=True,
                                                opset_version=opset, input_names=list(inputs), output_names=["y"])
            except Exception as err:  # the exporter's failures have no common type
                print(f"{name} opset {opset}: export failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
                continue
            proto = program.model_proto
            proto.ir_version = min(proto.ir_version, 10)  # onnxruntime 1.31 loads IR 10
            path = out / f"{name}_o{opset}.onnx"
            onnx.save(proto, path)
            feeds = {k: v.numpy() for k, v in inputs.items()}
            y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            np.savez(path.with_suffix(".io.npz"), **feeds, y=y)
            print(f"{name} opset {opset}: {', '.join(sorted({n.op_type for n in proto.graph.node}))}", flush=True)
    return 0


BACKENDS = ("reference", "cpu", "cuda-sim")


def check(folder: Path, backends: tuple[str, ...] = ("reference",)) -> int:
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from engine.api import load_graph, run_reference
    from engine.errors import TileweaveError
    from engine.runtime.execute import run_model

    def outputs(graph, feeds: dict, backend: str) -> dict:
        if backend == "reference":
            return run_reference(graph, feeds)
        return run_model(graph, feeds, backend=backend, policy="welder").outputs

    bad = 0
    paths = sorted(folder.glob("*.onnx"))
    if not paths:
        print(f"error: no .onnx files in {folder} (run `sweep.py export {folder}` in the generation venv first)",
              file=sys.stderr)
        return 2
    for path in paths:
        data = path.with_suffix(".io.npz")
        if not data.exists():
            print(f"{path.stem:18s} FAIL no {data.name} beside it (export writes one per model)")
            bad += 1
            continue
        io = np.load(data)
        for backend in backends:
            label = f"{path.stem:18s}" + (f" {backend:9s}" if tuple(backends) != ("reference",) else "")
            try:
                graph = load_graph(path)
                got = outputs(graph, {s.name: io[s.name] for s in graph.inputs}, backend)[graph.output_names[0]]
            except TileweaveError as err:
                print(f"{label} FAIL {err}")
                bad += 1
                continue
            except Exception as err:  # a bug in tileweave: reported as such, and the sweep goes on
                print(f"{label} FAIL internal error {type(err).__name__}: {str(err).splitlines()[0][:200]}")
                bad += 1
                continue
            want = io["y"]
            err = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))
            ok = err < 1e-4
            bad += not ok
            print(f"{label} {'OK ' if ok else 'BAD'}  max rel err {err:.1e}", flush=True)
    return 1 if bad else 0


def _backends(text: str) -> tuple[str, ...]:
    names = [b for b in text.split(",") if b]
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {', '.join(unknown) or '(none given)'}: use "
                                         f"{', '.join(BACKENDS)}, comma-separated")
    return tuple(names)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="export the sweep's models (generation venv)")
    e.add_argument("dir", type=Path)
    e.add_argument("--only", default="", help="comma-separated model names (default: all)")
    c = sub.add_parser("check", help="check tileweave against onnxruntime on every exported model")
    c.add_argument("dir", type=Path)
    c.add_argument("--backends", type=_backends, default=("reference",),
                   help="comma-separated: reference (default), cpu, cuda-sim (the welder plan)")
    args = ap.parse_args(argv)
    if args.cmd == "export":
        return export(args.dir, [n for n in args.only.split(",") if n])
    return check(args.dir, args.backends)


if __name__ == "__main__":
    sys.exit(main())
