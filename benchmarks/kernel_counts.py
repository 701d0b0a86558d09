"""Kernels and ATen calls per forward of small default-architecture models, compiled on the CPU.

    TRITON_INTERPRET=1 python -m benchmarks.kernel_counts

A proxy for launches per call (issue 14) without a GPU: 4-layer BERT, GPT-2 and Llama (hidden size 64) and a
ResNet-50-shaped conv net (its channel counts divided by 16) under bf16 autocast on the CPU, kernels generated
by the Triton backend (Triton's interpreter runs them), counted in the wrappers kiln writes with KILN_DEBUG.
On CUDA the products are cuBLAS calls and autocast casts more, so the numbers differ; the differences between
two commits carry over.
"""
from __future__ import annotations

import glob
import re
import shutil
import tempfile

import torch
import torch.nn as nn

import kiln


class _Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int, down: bool):
        super().__init__()
        cout = width * 4
        self.c1, self.b1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.c2, self.b2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.c3, self.b3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) if down else None

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b3(self.c3(torch.relu(self.b2(self.c2(y)))))
        return torch.relu(y + (self.down(x) if self.down is not None else x))


def resnet50_shaped(scale: int = 16) -> nn.Module:
    """ResNet-50's layers (3, 4, 6, 3 bottlenecks; 53 batch norms) with every channel count divided by `scale`."""
    layers, cin = [nn.Conv2d(3, 64 // scale, 7, 2, 3, bias=False), nn.BatchNorm2d(64 // scale), nn.ReLU(),
                   nn.MaxPool2d(3, 2, 1)], 64 // scale
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for block in range(blocks):
            layers.append(_Bottleneck(cin, width // scale, stride if block == 0 else 1, block == 0))
            cin = width // scale * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)).eval()


def count(model: nn.Module, args: tuple, **options) -> tuple:
    """(kernels, ATen calls) in the wrappers of `model`'s compiled graphs."""
    directory = tempfile.mkdtemp(prefix="kiln_counts_")
    try:
        with kiln.config.patch(cpu_backend="triton", debug=True, debug_dir=directory, graph_cache=False, **options), \
                torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            kiln.compile(model)(*args)
        kernels = externs = 0
        for path in glob.glob(f"{directory}/*/graph_*/wrapper.py"):
            text = open(path).read()
            kernels += len(re.findall(r"^\s+k\d+\(", text, re.M))
            externs += len(re.findall(r"= node\d+\(", text))
        return kernels, externs
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    import transformers
    torch.manual_seed(0)
    ids = torch.randint(0, 512, (2, 16))
    models = {
        "bert": (transformers.BertModel(transformers.BertConfig(hidden_size=64, num_hidden_layers=4,
                 num_attention_heads=4, intermediate_size=256, vocab_size=512)).eval(), (ids,), {}),
        "gpt2": (transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=4, n_head=4,
                 vocab_size=512)).eval(), (ids,), {}),
        "llama": (transformers.LlamaForCausalLM(transformers.LlamaConfig(hidden_size=64, intermediate_size=176,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)).eval(),
                  (ids,), {}),
        "resnet50-shaped": (resnet50_shaped(), (torch.randn(1, 3, 64, 64),), {"conv_layout": "channels_last"}),
    }
    for name, (model, args, options) in models.items():
        kernels, externs = count(model, args, **options)
        print(f"{name:16s} kernels {kernels:3d}  ATen calls {externs:3d}", flush=True)


if __name__ == "__main__":
    main()
