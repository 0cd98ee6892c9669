"""The zoo's model definitions: each entry builds a torch module from a small config (random init, fixed
seed) and the example inputs it is exported with. Imported by make_zoo.py inside the generation venv."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ZooModel:
    name: str
    family: str
    description: str
    build: Callable[[torch.Generator], tuple[nn.Module, dict[str, torch.Tensor]]]
    outputs: tuple[str, ...]
    opset: int | None = None  # the dynamo exporter's default (20 with torch 2.13) when None


def _image(gen: torch.Generator, size: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(1, 3, size, size, generator=gen)}


class _HFOutputs(nn.Module):
    """A transformers model whose output object is reduced to a tuple of named tensors."""

    def __init__(self, model: nn.Module, inputs: tuple[str, ...], fields: tuple[str, ...]):
        super().__init__()
        self.model, self.inputs, self.fields = model, inputs, fields

    def forward(self, *args):
        out = self.model(**dict(zip(self.inputs, args)))
        return tuple(getattr(out, f) for f in self.fields)


def _hf(model_cls, config, inputs: dict[str, torch.Tensor], fields: tuple[str, ...]):
    return _HFOutputs(model_cls(config), tuple(inputs), fields), inputs


# ---- transformers encoders ------------------------------------------------------------------------


def build_bert(gen):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=512, max_position_embeddings=128, attn_implementation="eager")
    ids = torch.randint(1, cfg.vocab_size, (1, 128), generator=gen)
    mask = torch.ones(1, 128, dtype=torch.int64)
    mask[:, 112:] = 0  # the last 16 tokens are padding: the mask takes part in the softmax
    return _hf(BertModel, cfg, {"input_ids": ids, "attention_mask": mask}, ("last_hidden_state", "pooler_output"))


def build_vit(gen):
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(image_size=64, patch_size=8, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=512, attn_implementation="eager")
    return _hf(ViTModel, cfg, _image(gen, 64), ("last_hidden_state", "pooler_output"))


def build_mobilevit(gen):
    from transformers import MobileViTConfig, MobileViTModel

    cfg = MobileViTConfig(image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 40, 48, 96],
                          num_attention_heads=4, attn_implementation="eager")
    return _hf(MobileViTModel, cfg, _image(gen, 64), ("last_hidden_state", "pooler_output"))


def build_swin(gen):
    from transformers import SwinConfig, SwinModel

    cfg = SwinConfig(image_size=64, patch_size=4, embed_dim=32, depths=[2, 2, 2], num_heads=[2, 4, 8],
                     window_size=4, mlp_ratio=2.0, attn_implementation="eager")
    return _hf(SwinModel, cfg, _image(gen, 64), ("last_hidden_state", "pooler_output"))


def build_gpt2(gen):
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(vocab_size=1000, n_positions=128, n_embd=128, n_layer=2, n_head=4, use_cache=False,
                     bos_token_id=1, eos_token_id=2,
                     attn_implementation="eager")
    ids = torch.randint(1, cfg.vocab_size, (1, 64), generator=gen)
    return _hf(GPT2Model, cfg, {"input_ids": ids}, ("last_hidden_state",))


# ---- transformers convnets ------------------------------------------------------------------------


def build_mobilenetv2(gen):
    from transformers import MobileNetV2Config, MobileNetV2Model

    cfg = MobileNetV2Config(image_size=64, depth_multiplier=0.35)
    return _hf(MobileNetV2Model, cfg, _image(gen, 64), ("last_hidden_state", "pooler_output"))


def build_resnet(gen):
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[2, 2, 2, 2], layer_type="basic")
    return _hf(ResNetModel, cfg, _image(gen, 64), ("last_hidden_state", "pooler_output"))


def build_convnext(gen):
    from transformers import ConvNextConfig, ConvNextModel

    cfg = ConvNextConfig(image_size=64, patch_size=4, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 3, 1])
    return _hf(ConvNextModel, cfg, _image(gen, 64), ("last_hidden_state", "pooler_output"))


def build_efficientnet(gen):
    from transformers import EfficientNetConfig, EfficientNetModel

    cfg = EfficientNetConfig(image_size=64, width_coefficient=0.25, depth_coefficient=0.5, hidden_dim=320)
    return _hf(EfficientNetModel, cfg, _image(gen, 64), ("last_hidden_state", "pooler_output"))


# ---- plain torch ----------------------------------------------------------------------------------


class Lstm(nn.Module):
    """Two stacked LSTM layers over a sequence, then a linear head on every step."""

    def __init__(self, inputs: int = 64, hidden: int = 128):
        super().__init__()
        self.lstm = nn.LSTM(inputs, hidden, num_layers=2)
        self.head = nn.Linear(hidden, 32)

    def forward(self, x):
        y, (h, _) = self.lstm(x)
        return self.head(y), h


def build_lstm(gen):
    return Lstm(), {"x": torch.randn(32, 1, 64, generator=gen)}


class Nerf(nn.Module):
    """NeRF's MLP with its positional encodings computed in the graph: 8 layers of width 128 with the
    encoded point concatenated back in at layer 5, a density head, and a view-dependent colour head."""

    def __init__(self, width: int = 128, pos_freqs: int = 10, dir_freqs: int = 4):
        super().__init__()
        self.pos_freqs, self.dir_freqs = pos_freqs, dir_freqs
        pos_dim, dir_dim = 3 + 6 * pos_freqs, 3 + 6 * dir_freqs
        dims = [pos_dim] + [width] * 4 + [width + pos_dim] + [width] * 2
        self.layers = nn.ModuleList(nn.Linear(d, width) for d in dims)
        self.sigma = nn.Linear(width, 1)
        self.feature = nn.Linear(width, width)
        self.view = nn.Linear(width + dir_dim, width // 2)
        self.rgb = nn.Linear(width // 2, 3)

    @staticmethod
    def encode(x, freqs: int):
        scales = 2.0 ** torch.arange(freqs, dtype=x.dtype)
        angles = (x[..., None, :] * scales[:, None]).flatten(-2)
        return torch.cat([x, torch.sin(angles), torch.cos(angles)], dim=-1)

    def forward(self, points, dirs):
        p = self.encode(points, self.pos_freqs)
        h = p
        for k, layer in enumerate(self.layers):
            h = torch.relu(layer(torch.cat([h, p], dim=-1) if k == 5 else h))
        sigma = torch.relu(self.sigma(h))
        v = torch.relu(self.view(torch.cat([self.feature(h), self.encode(dirs, self.dir_freqs)], dim=-1)))
        return torch.cat([torch.sigmoid(self.rgb(v)), sigma], dim=-1)


def build_nerf(gen):
    dirs = torch.randn(2048, 3, generator=gen)
    return Nerf(), {"points": torch.rand(2048, 3, generator=gen) * 2 - 1,
                    "dirs": dirs / dirs.norm(dim=-1, keepdim=True)}


class DecoderStep(nn.Module):
    """One decode step of a LLaMA-style decoder with a KV cache: RMSNorm, rotary position embeddings on
    q and k, the new k/v concatenated to the cache, one query row against 64 keys, SiLU-gated MLP."""

    def __init__(self, dim: int = 128, heads: int = 4, layers: int = 2, hidden: int = 344, past: int = 63):
        super().__init__()
        self.heads, self.hd, self.past = heads, dim // heads, past
        self.norms = nn.ParameterList(nn.Parameter(torch.ones(dim)) for _ in range(2 * layers + 1))
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim, bias=False) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(layers))
        self.gate_up = nn.ModuleList(nn.Linear(dim, 2 * hidden, bias=False) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(hidden, dim, bias=False) for _ in range(layers))
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        angle = past * inv  # the new token's position is `past`
        self.register_buffer("cos", torch.cat([angle, angle]).cos(), persistent=False)
        self.register_buffer("sin", torch.cat([angle, angle]).sin(), persistent=False)

    @staticmethod
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def rope(self, x):
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rotated * self.sin

    def forward(self, x, past_k, past_v):
        keys, values = [], []
        for k in range(len(self.qkv)):
            q, kk, v = self.qkv[k](self.rms(x, self.norms[2 * k])).split(x.shape[-1], dim=-1)
            q, kk, v = (t.view(1, 1, self.heads, self.hd).transpose(1, 2) for t in (q, kk, v))
            kk = torch.cat([past_k[k], self.rope(kk)], dim=2)
            v = torch.cat([past_v[k], v], dim=2)
            keys.append(kk)
            values.append(v)
            att = torch.softmax(self.rope(q) @ kk.transpose(-1, -2) / self.hd ** 0.5, dim=-1) @ v
            x = x + self.out[k](att.transpose(1, 2).reshape(1, 1, -1))
            gate, up = self.gate_up[k](self.rms(x, self.norms[2 * k + 1])).chunk(2, dim=-1)
            x = x + self.down[k](nn.functional.silu(gate) * up)
        return self.rms(x, self.norms[-1]), torch.stack(keys), torch.stack(values)


def build_decoder_kv(gen):
    m = DecoderStep()
    shape = (len(m.qkv), 1, m.heads, m.past, m.hd)
    return m, {"x": torch.randn(1, 1, 128, generator=gen), "past_k": torch.randn(*shape, generator=gen),
               "past_v": torch.randn(*shape, generator=gen)}


class UNet(nn.Module):
    """U-Net for segmentation (Ronneberger et al.; the layout of the widely used Pytorch-UNet): double 3x3
    conv blocks with BatchNorm, three 2x2 max-pool downsamplings, and back up two ways — learned 2x2
    stride-2 transposed convs on the two deep levels, bilinear upsampling (align_corners, as Pytorch-UNet's
    bilinear variant) then a 3x3 conv on the last — each concatenated with its skip, then a 1x1 head."""

    def __init__(self, classes: int = 4, width: int = 12):
        super().__init__()

        def block(ci, co):
            return nn.Sequential(nn.Conv2d(ci, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.ReLU(),
                                 nn.Conv2d(co, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.ReLU())

        w = width
        self.enc = nn.ModuleList([block(3, w), block(w, 2 * w), block(2 * w, 4 * w)])
        self.bottom = block(4 * w, 8 * w)
        self.pool = nn.MaxPool2d(2)
        self.up3 = nn.ConvTranspose2d(8 * w, 4 * w, 2, stride=2)
        self.dec3 = block(8 * w, 4 * w)
        self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
        self.dec2 = block(4 * w, 2 * w)
        self.up1 = nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True),
                                 nn.Conv2d(2 * w, w, 3, padding=1))
        self.dec1 = block(2 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        skips = []
        for enc in self.enc:
            x = enc(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottom(x)
        for up, dec, skip in ((self.up3, self.dec3, skips[2]), (self.up2, self.dec2, skips[1]),
                              (self.up1, self.dec1, skips[0])):
            x = dec(torch.cat([skip, up(x)], dim=1))
        return self.head(x)


def build_unet(gen):
    return UNet(), _image(gen, 64)


def build_llama(gen):
    """Exported at opset 23, where torch writes scaled_dot_product_attention as one Attention node and
    nn.RMSNorm as RMSNormalization (the ops modern decoder exports carry)."""
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, use_cache=False,
                      attn_implementation="sdpa")
    ids = torch.randint(0, cfg.vocab_size, (1, 32), generator=gen)
    return _hf(LlamaModel, cfg, {"input_ids": ids}, ("last_hidden_state",))


ZOO = (
    ZooModel("bert", "BERT", "BertModel: 2 layers, hidden 128, 4 heads, FFN 512, seq 128 with 16 padded tokens "
             "(attention mask from the input), eager attention, pooler.", build_bert,
             ("last_hidden_state", "pooler_output")),
    ZooModel("vit", "ViT", "ViTModel: 64x64 image, 8x8 patches (64 tokens + CLS), 2 layers, hidden 128, "
             "4 heads, MLP 512, pooler.", build_vit, ("last_hidden_state", "pooler_output")),
    ZooModel("mobilevit", "MobileViT", "MobileViTModel: 64x64 image, MobileNetV2 blocks then MobileViT blocks "
             "(unfold to 2x2 patches, transformer of dims 32/48/64, fold back, fuse conv), SiLU.",
             build_mobilevit, ("last_hidden_state", "pooler_output")),
    ZooModel("swin", "Swin", "SwinModel: 64x64 image, 4x4 patches, embed 32, depths 2/2/2, heads 2/4/8, "
             "window 4 with shifted windows (roll + attention mask), patch merging.", build_swin,
             ("last_hidden_state", "pooler_output")),
    ZooModel("mobilenetv2", "MobileNetV2", "MobileNetV2Model: 64x64 image, depth multiplier 0.35, 17 inverted "
             "residual blocks (depthwise 3x3, ReLU6), TF-style padding, 1x1 conv to 1280, pooler.",
             build_mobilenetv2, ("last_hidden_state", "pooler_output")),
    ZooModel("resnet", "ResNet", "ResNetModel: 64x64 image, ResNet-18 layout (basic blocks 2/2/2/2) at widths "
             "16/32/64/128, BatchNorm, max pool stem, global average pool.", build_resnet,
             ("last_hidden_state", "pooler_output")),
    ZooModel("convnext", "ConvNeXt", "ConvNextModel: 64x64 image, patchify stem, depths 1/1/3/1 at widths "
             "16/32/64/128: depthwise 7x7, channels-last LayerNorm, pointwise MLP with GELU, layer scale.",
             build_convnext, ("last_hidden_state", "pooler_output")),
    ZooModel("lstm", "LSTM", "torch nn.LSTM: 2 stacked layers, 32 steps, batch 1, input 64, hidden 128, then a "
             "linear head on every step; outputs the head and the final hidden states.", build_lstm,
             ("y", "h")),
    ZooModel("nerf", "NeRF MLP", "NeRF MLP on 2048 points: sin/cos positional encodings (10 and 4 frequencies) "
             "in the graph, 8 x Linear+ReLU width 128 with a skip concat at layer 5, density head, "
             "view-dependent colour head with Sigmoid.", build_nerf, ("rgb_sigma",)),
    ZooModel("gpt2", "GPT-2", "GPT2Model (decoder only): 2 layers, hidden 128, 4 heads, 64 tokens with the "
             "causal mask, Conv1D (addmm) projections, tanh-GELU.", build_gpt2, ("last_hidden_state",)),
    ZooModel("efficientnet", "EfficientNet", "EfficientNetModel: 64x64 image, width 0.25, depth 0.5: MBConv "
             "blocks with depthwise 3x3/5x5, swish, and squeeze-excitation (global pool, two 1x1 convs, "
             "sigmoid gate broadcast back over the feature map).", build_efficientnet,
             ("last_hidden_state", "pooler_output")),
    ZooModel("decoder_kv", "LLaMA-style decode step", "One decode step of a 2-layer LLaMA-style decoder with a "
             "KV cache: RMSNorm, rotary embeddings, the new k/v concatenated onto 63 cached positions, one "
             "query row (GEMV-shaped projections and attention), SiLU-gated MLP; outputs the hidden state "
             "and the updated caches.", build_decoder_kv, ("hidden", "present_k", "present_v")),
    ZooModel("unet", "U-Net", "U-Net for segmentation on a 64x64 image: double 3x3 conv + BatchNorm + ReLU blocks "
             "at widths 12/24/48/96, 2x2 max pools, up by 2x2 stride-2 ConvTranspose twice and by bilinear "
             "Upsample (align_corners) + 3x3 conv once, skip concats, 1x1 head to 4 classes.", build_unet,
             ("logits",)),
    ZooModel("llama", "LLaMA (opset 23)", "LlamaModel (prefill): 2 layers, hidden 64, 4 query heads over 2 KV heads "
             "(grouped-query), 32 tokens, rotary embeddings, SiLU-gated MLP; exported at opset 23, so attention "
             "is one Attention node (causal) and each RMSNorm one RMSNormalization node.", build_llama,
             ("last_hidden_state",), opset=23),
)
