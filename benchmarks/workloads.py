"""What the benchmarks run: real models and roofline kernels, each as a `Workload`.

Every model is built from its config with random weights (no downloads). `small=True`
shrinks each one so that the whole harness runs on a CPU in minutes; the shapes of
the full workloads are those of /work/shared/design/TARGETS.md.

A workload carries its inputs for inference and for training, and how to turn the
output of a training call into a scalar loss. Dropout is set to 0 everywhere so that
training calls are deterministic and can be checked against eager and float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F


@dataclass
class Workload:
    """One program to benchmark: a module (or function) and its inputs."""

    name: str
    shape: str                                   # human-readable, for the tables
    program: torch.nn.Module | Callable          # what gets compiled
    infer_args: tuple = ()
    infer_kwargs: dict = field(default_factory=dict)
    train_args: tuple = ()
    train_kwargs: dict = field(default_factory=dict)
    loss_of: Callable[[Any], torch.Tensor] | None = None  # None: no training mode for this workload
    autocast: bool = True                        # bf16 autocast on CUDA (models); kernels pick dtypes
    bytes_moved: int | None = None               # kernels: inputs read once + outputs written once

    @property
    def is_module(self) -> bool:
        return isinstance(self.program, torch.nn.Module)


class MissingDependency(RuntimeError):
    """A workload needs a package this machine does not have (timm, torchvision)."""


# --------------------------------------------------------------------------- models

def _token_batch(vocab_size: int, batch: int, seq: int, device: str) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, seq), device=device)


def _regression_loss(target: torch.Tensor) -> Callable[[Any], torch.Tensor]:
    """Loss of a model without a head: mean squared error of its last hidden state against a
    fixed random target (a plain mean of squares would be constant after a final LayerNorm)."""

    def loss_of(output) -> torch.Tensor:
        hidden = output[0] if isinstance(output, (tuple, list)) else output.last_hidden_state
        return F.mse_loss(hidden.float(), target)

    return loss_of


def _model_loss(output) -> torch.Tensor:
    """Loss computed inside a transformers model (labels were passed)."""
    return output.loss if hasattr(output, "loss") else output[0]


def bert(small: bool, device: str) -> Workload:
    import transformers

    if small:
        config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                         intermediate_size=128, vocab_size=100, max_position_embeddings=64)
        batch, seq = 2, 16
    else:
        config = transformers.BertConfig()  # bert-base: 12 layers, hidden 768, 12 heads
        batch, seq = 8, 512
    model = transformers.BertModel(config).to(device)
    input_ids = _token_batch(config.vocab_size, batch, seq, device)
    target = torch.randn(batch, seq, config.hidden_size, device=device)
    return Workload("bert", f"{batch} x {seq} tokens", model, infer_kwargs={"input_ids": input_ids},
                    train_kwargs={"input_ids": input_ids}, loss_of=_regression_loss(target))


def gpt2(small: bool, device: str) -> Workload:
    import transformers

    if small:
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
                                         bos_token_id=99, eos_token_id=99)
        batch, seq = 2, 16
    else:
        config = transformers.GPT2Config()  # gpt2: 12 layers, hidden 768, 12 heads
        batch, seq = 8, 512
    model = transformers.GPT2LMHeadModel(config).to(device)
    input_ids = _token_batch(config.vocab_size, batch, seq, device)
    return Workload("gpt2", f"{batch} x {seq} tokens", model, infer_kwargs={"input_ids": input_ids},
                    train_kwargs={"input_ids": input_ids, "labels": input_ids}, loss_of=_model_loss)


def llama(small: bool, device: str) -> Workload:
    import transformers

    if small:
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=176, vocab_size=100,
                                          max_position_embeddings=64)
        batch, seq = 2, 16
    else:
        config = transformers.LlamaConfig(num_hidden_layers=8, hidden_size=1024, num_attention_heads=16,
                                          num_key_value_heads=8, intermediate_size=2816, vocab_size=32000,
                                          max_position_embeddings=2048)
        batch, seq = 4, 1024
    model = transformers.LlamaForCausalLM(config).to(device)
    input_ids = _token_batch(config.vocab_size, batch, seq, device)
    return Workload("llama", f"{batch} x {seq} tokens", model, infer_kwargs={"input_ids": input_ids},
                    train_kwargs={"input_ids": input_ids, "labels": input_ids}, loss_of=_model_loss)


def _image_workload(name: str, model: torch.nn.Module, batch: int, size: int, device: str) -> Workload:
    images = torch.randn(batch, 3, size, size, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)

    def classification_loss(logits):
        return F.cross_entropy(logits.float(), labels)

    return Workload(name, f"{batch} x 3x{size}x{size}", model, infer_args=(images,),
                    train_args=(images,), loss_of=classification_loss)


def _timm():
    try:
        import timm
    except ImportError as error:
        raise MissingDependency(f"timm is not installed ({error})") from None
    return timm


def resnet50(small: bool, device: str) -> Workload:
    timm = _timm()
    model = timm.create_model("resnet50", pretrained=False).to(device)
    return _image_workload("resnet50", model, *((2, 64) if small else (64, 224)), device)


def vit(small: bool, device: str) -> Workload:
    timm = _timm()
    if small:
        model = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=32, depth=2,
                                  embed_dim=64, num_heads=4)
        batch, size = 2, 32
    else:
        model = timm.create_model("vit_base_patch16_224", pretrained=False)
        batch, size = 64, 224
    return _image_workload("vit", model.to(device), batch, size, device)


def resnet18(small: bool, device: str) -> Workload:
    try:
        import torchvision
    except Exception as error:  # PyPI's torchvision can fail to import beside a CPU torch build
        raise MissingDependency(f"torchvision does not import ({type(error).__name__}: {error})") from None
    model = torchvision.models.resnet18(weights=None).to(device)
    return _image_workload("resnet18", model, *((2, 64) if small else (64, 224)), device)


class BasicBlock(torch.nn.Module):
    """conv-bn-relu-conv-bn plus a (strided 1x1 conv when the shape changes) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(out_channels)
        self.conv2 = torch.nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(out_channels)
        self.shortcut = torch.nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(out_channels))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(torch.nn.Module):
    """A ResNet-style CNN of a few blocks, needing neither timm nor torchvision."""

    def __init__(self, width: int = 16, num_classes: int = 10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(width), torch.nn.ReLU())
        self.blocks = torch.nn.Sequential(BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2))
        self.head = torch.nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


def cnn(small: bool, device: str) -> Workload:
    model = SmallResNet(width=8 if small else 64).to(device)
    return _image_workload("cnn", model, *((2, 16) if small else (64, 224)), device)


# The models of TARGETS.md, in its order; `cnn` is kiln's own dependency-free ResNet.
MODELS: dict[str, Callable[[bool, str], Workload]] = {
    "bert": bert, "gpt2": gpt2, "llama": llama, "resnet50": resnet50, "vit": vit, "resnet18": resnet18,
    "cnn": cnn,
}
DEFAULT_MODELS = ["bert", "gpt2", "llama", "resnet50", "vit", "resnet18"]
DEFAULT_SMALL_MODELS = ["bert", "gpt2", "llama", "cnn", "resnet50", "vit", "resnet18"]


# --------------------------------------------------------------------------- kernels

def sin_add(x, y):
    return torch.sin(x) + torch.sin(y)


def gelu_bias(x, bias):
    return F.gelu(x + bias)


def layer_norm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


def softmax_last(x):
    return torch.softmax(x, dim=-1)


def rmsnorm_silu_gate(x, weight, gate):
    """Llama's MLP input: RMSNorm (in float32 for low-precision inputs) * w, silu, * gate."""
    wide = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    normed = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight
    return F.silu(normed) * gate


def column_sum(x):
    """A linear layer's bias gradient: the sum over the leading (token) dim, an outer reduction."""
    return x.sum(0)


def linear_gelu(x, weight, bias):
    """BERT's FFN up-projection: a product, its bias and gelu (a product template's epilogue)."""
    return F.gelu(F.linear(x, weight, bias))


def linear_residual(x, weight, bias, residual):
    """BERT's FFN down-projection with the residual add after it."""
    return F.linear(x, weight, bias) + residual


def lm_head(x, weight):
    """GPT-2's LM head: the hidden states times the (tied) embedding, 50257 columns (odd: misaligned rows)."""
    return F.linear(x, weight)


def copy_into(source, destination):
    """The copy ceiling: read 1 GiB, write 1 GiB."""
    return destination.copy_(source)


def _kernel(name: str, shape: str, fn: Callable, *inputs: torch.Tensor) -> Workload:
    """A kernel program whose one output has the shape and dtype of its first input."""
    output_bytes = inputs[0].numel() * inputs[0].element_size()
    bytes_moved = sum(t.numel() * t.element_size() for t in inputs) + output_bytes
    return Workload(name, shape, fn, infer_args=inputs, autocast=False, bytes_moved=bytes_moved)


def _product(name: str, shape: str, fn: Callable, *inputs: torch.Tensor) -> Workload:
    """A product with its epilogue: compute-bound, so it has no copy ceiling (bytes_moved None)."""
    return Workload(name, shape, fn, infer_args=inputs, autocast=False, bytes_moved=None)


def kernel_workload(name: str, small: bool, device: str) -> Workload:
    """One row of TARGETS.md's roofline table (shrunk, and float32, when small)."""
    low = torch.float32 if small else torch.bfloat16
    rows, cols = (32, 512) if small else (65536, 4096)  # small: few programs for the interpreter
    matrix = f"{rows}x{cols} {str(low).replace('torch.', '')}"

    def randn(*size, dtype=low):
        return torch.randn(*size, device=device, dtype=dtype)

    if name == "copy":
        numel = (1 << 22) if small else (1 << 28)  # fp32: 16 MiB small, 1 GiB full
        source = randn(numel, dtype=torch.float32)
        workload = _kernel(name, f"{numel * 4 >> 20} MiB fp32", copy_into, source, torch.empty_like(source))
        workload.bytes_moved = 2 * source.numel() * source.element_size()
        return workload
    if name == "sin_10k":
        return _kernel(name, "10k fp32", sin_add, randn(10_000, dtype=torch.float32),
                       randn(10_000, dtype=torch.float32))
    if name == "sin_large":
        log2 = 16 if small else 28
        return _kernel(name, f"2^{log2} fp32", sin_add, randn(1 << log2, dtype=torch.float32),
                       randn(1 << log2, dtype=torch.float32))
    if name == "gelu_bias":
        return _kernel(name, matrix, gelu_bias, randn(rows, cols), randn(cols))
    if name == "layer_norm":
        return _kernel(name, matrix, layer_norm, randn(rows, cols), randn(cols), randn(cols))
    if name == "softmax":
        return _kernel(name, matrix, softmax_last, randn(rows, cols))
    if name == "column_sum":
        workload = _kernel(name, matrix, column_sum, randn(rows, cols))
        workload.bytes_moved = (rows + 1) * cols * workload.infer_args[0].element_size()
        return workload
    if name == "rmsnorm_silu_gate":
        return _kernel(name, matrix, rmsnorm_silu_gate, randn(rows, cols), randn(cols), randn(rows, cols))
    if name in ("linear_gelu", "linear_residual"):
        # BERT-base's FFN at 8 x 512 tokens: 768 <-> 3072 (small: 32 tokens, 64 <-> 256)
        tokens, hidden = (32, 64) if small else (4096, 768)
        inner, outer = (4 * hidden, hidden) if name == "linear_gelu" else (hidden, 4 * hidden)
        shape = f"{tokens}x{outer} @ {outer}x{inner} {str(low).replace('torch.', '')}"
        x, weight, bias = randn(tokens, outer), randn(inner, outer) / outer ** 0.5, randn(inner)
        if name == "linear_gelu":
            return _product(name, shape, linear_gelu, x, weight, bias)
        return _product(name, shape, linear_residual, x, weight, bias, randn(tokens, inner))
    if name == "lm_head":
        # GPT-2 at 8 x 512 tokens (small: 32 tokens, 64 -> 67 columns)
        tokens, hidden, vocab = (32, 64, 67) if small else (4096, 768, 50257)
        shape = f"{tokens}x{hidden} @ {hidden}x{vocab} {str(low).replace('torch.', '')}"
        return _product(name, shape, lm_head, randn(tokens, hidden), randn(vocab, hidden) / hidden ** 0.5)
    raise KeyError(f"unknown kernel workload {name!r}; choose from {KERNELS}")


KERNELS = ["copy", "sin_10k", "sin_large", "gelu_bias", "layer_norm", "softmax", "rmsnorm_silu_gate", "column_sum",
           "linear_gelu", "linear_residual", "lm_head"]
KERNEL_TITLES = {
    "copy": "copy (the ceiling)", "sin_10k": "sin(x)+sin(y)", "sin_large": "sin(x)+sin(y)",
    "gelu_bias": "gelu(x + b)", "layer_norm": "layer_norm", "softmax": "softmax(dim=-1)",
    "rmsnorm_silu_gate": "RMSNorm * w, silu, * gate", "column_sum": "x.sum(0) (a bias gradient)",
    "linear_gelu": "gelu(x @ W.T + b)", "linear_residual": "x @ W.T + b + r",
    "lm_head": "x @ E.T (GPT-2's LM head)",
}


def build(suite: str, name: str, small: bool, device: str) -> Workload:
    """The workload `name` of `suite` ('models' or 'kernels'), seeded for reproducibility."""
    torch.manual_seed(0)
    if suite == "kernels":
        return kernel_workload(name, small, device)
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; choose from {sorted(MODELS)}")
    return MODELS[name](small, device)


def geometric_mean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None
