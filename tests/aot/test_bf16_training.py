"""A ViT training step under CPU bf16 autocast: kiln's decompositions and kernels no less precise than eager.

Issue 16: on the H200 ViT-B/16's training loss was farther from float64 under kiln than under eager.
The suspicion was a decomposition in kiln's table (kiln/aot/decompositions.py) that computes in bf16
what ATen computes in float32. These tests run a small timm-style ViT (patch-embedding conv, class
token, pre-LayerNorm blocks, GELU MLP, the class token's head) forward, cross-entropy and backward
under bf16 autocast, with attention either through F.scaled_dot_product_attention (timm's path) or
written out (q k^T, softmax, @ v: Hugging Face's eager path, which puts `_softmax` and its backward
through kiln's decompositions), on the `aot_eager` rung (kiln's decompositions, the graphs run by
torch) and on `kiln` (C++ kernels). Each is judged against eager and a float64 copy of the model by
kiln's accuracy rule (`kiln.testing.compare`): the logits, and every parameter's gradient.

Not the loss itself: it is one number, whose error is mostly the bf16 rounding of the logits, so any
float32-level change upstream (a decomposed LayerNorm rounds differently from eager's kernel, and is
as accurate: 5.0e-8 relative error for both, 4096 x 768 float32) redraws it. The rule (at most twice
eager's error) rejected eager itself, on a batch perturbed by one float32 ulp, on 10% to 37% of batches
of small CPU ViTs (benchmarks/results/2026-12-04_vit-precision-cpu-6ea47cb.md). The logits carry the
same information in hundreds of values.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from kiln.testing import compare

DIM, HEADS, DEPTH, CLASSES, BATCH, IMAGE, PATCH = 64, 4, 2, 100, 4, 16, 4


class Attention(nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        self.fused = fused
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x):
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        if self.fused:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            x = torch.softmax(q @ k.transpose(-1, -2) * (DIM // HEADS) ** -0.5, dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(batch, tokens, DIM))


class Block(nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM, eps=1e-6), nn.LayerNorm(DIM, eps=1e-6)
        self.attn = Attention(fused)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)
        self.drop = nn.Dropout(0.0)  # timm's default probability: kept, as timm keeps the module

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


class TinyViT(nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, PATCH, stride=PATCH)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (IMAGE // PATCH) ** 2 + 1, DIM) * 0.02)
        self.blocks = nn.Sequential(*[Block(fused) for _ in range(DEPTH)])
        self.norm = nn.LayerNorm(DIM, eps=1e-6)
        self.head = nn.Linear(DIM, CLASSES)
        for module in self.modules():  # timm's init: trunc_normal(std=.02) linears; biases random here, so
            if isinstance(module, nn.Linear):  # that the bias terms' own roundings are exercised too
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.normal_(module.bias, std=0.02)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


@pytest.fixture(autouse=True)
def _strict_fresh_kiln():
    """A graph kiln cannot compile raises instead of running eagerly (which would pass trivially)."""
    kiln.reset()
    with kiln.config.patch(strict=True):
        yield
    kiln.reset()


def _step(model: nn.Module, program, images, labels, *, autocast: bool):
    """Logits and every parameter's gradient of forward + cross-entropy + backward."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = program(images)
        loss = F.cross_entropy(logits.float(), labels)
    loss.backward()
    return logits.detach(), [parameter.grad.detach().clone() for parameter in model.parameters()]


@pytest.mark.parametrize("fused", [True, False], ids=["sdpa", "math_attention"])
@pytest.mark.parametrize("rung", ["aot_eager", "kiln"])
def test_vit_step_under_bf16_autocast_is_as_precise_as_eager(rung, fused):
    model = TinyViT(fused).train()
    reference = copy.deepcopy(model).double()
    compiled = kiln.compile(model, backend=rung)
    names = [name for name, _ in model.named_parameters()]
    for seed in range(2):
        generator = torch.Generator().manual_seed(seed)
        images = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator)
        labels = torch.randint(0, CLASSES, (BATCH,), generator=generator)
        exact_logits, exact_gradients = _step(reference, reference, images.double(), labels, autocast=False)
        eager_logits, eager_gradients = _step(model, model, images, labels, autocast=True)
        logits, gradients = _step(model, compiled, images, labels, autocast=True)
        assert logits.dtype == eager_logits.dtype == torch.bfloat16
        # judged as float32 values: the rule's floor for a bf16 result (16 bf16 ulp of the largest logit,
        # 12% of it) would accept nearly anything, where eager's own error is under 1% of the logits' norm
        verdict = compare(logits.float(), eager_logits.float(), exact_logits)
        assert verdict, f"{rung}, seed {seed}: logits: {verdict.message}"
        for name, got, want, exact in zip(names, gradients, eager_gradients, exact_gradients):
            verdict = compare(got, want, exact)
            assert verdict, f"{rung}, seed {seed}: gradient of {name}: {verdict.message}"
