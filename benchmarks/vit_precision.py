"""ViT training precision on the CPU, without timm: each backend's loss and gradients against float64.

    python -m benchmarks.vit_precision [--seeds 8] [--depth 4] [--dim 192] [--dropout 0.0] [--summary-only]
        [--backends eager,eager~,torch:aot_eager,torch:aot_eager_kiln_decomps,kiln:aot_eager,kiln]

A plain-torch copy of timm's VisionTransformer (patch-embedding conv, class token and position
embedding, pre-LayerNorm blocks whose attention calls F.scaled_dot_product_attention as timm's
fused_attn does, GELU MLP, dropout modules, final LayerNorm, the class token's head) with timm's
default initialization (trunc_normal(std=.02) linears with zero biases, eps=1e-6 LayerNorms). Each
backend runs forward, `F.cross_entropy(logits.float(), labels)` and backward under CPU bf16 autocast,
as benchmarks.loss_seeds does; the reference is a float64 copy of the model without autocast.

CPU autocast's op lists are not CUDA's. Here as on CUDA the convolution, the linears and SDPA run in
bf16 and the residual stream is float32, so each LayerNorm gets float32 and returns float32 (on CUDA
because layer_norm is on autocast's float32 list; on the CPU because it is on neither list and runs in
its input's dtype). GELU gets fc1's bf16 output and returns bf16 on both. Cross-entropy is on the CPU's
float32 list (the logits are cast to float anyway). The attention kernels differ: the CPU's
`_scaled_dot_product_flash_attention_for_cpu` against CUDA's flash (or cuDNN) kernels.

Backends: eager; `eager~` (eager on the batch times (1 + 2^-22 n), n standard normal, against float64 on
that batch: an equally precise run whose bf16 roundings fall elsewhere, the yardstick for the spread of
the loss error, as in benchmarks.loss_seeds); `torch:aot_eager` (torch.compile's aot_eager: TorchDynamo
and AOTAutograd with no decompositions); `torch:aot_eager_kiln_decomps` (TorchDynamo and AOTAutograd
with kiln's decomposition table and partitioner, the graphs run by torch: kiln's decompositions without
kiln's frontend); `kiln:<rung>` (kiln.compile with a rung of its ladder).

Dropout: timm's default ViT has every dropout probability 0 (as this one by default). With --dropout p,
every run of a seed starts from the same torch.manual_seed, so eager and the float64 reference draw the
same masks (CPU bernoulli draws do not depend on the dtype); a compiled backend that consumed the
generator differently would draw other masks and show a large error, never a small one.

Per seed it prints the loss's signed error loss - loss64, the logits' relative error ||z - z64|| /
||z64|| and the gradients' relative error over all parameters; then the median and the root mean square
of the absolute values per backend, on how many seeds benchmarks.run's rule (|error| at most 2x eager's
plus 16 float32 ulp) rejects the loss, and the correlation of the loss errors with eager's. The loss is
one number, the logits and gradients thousands: a backend whose error is systematically larger shows it
in their norms long before it shows in a median of loss errors. Writes nothing else.
"""
from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, attn_drop: float, proj_drop: float):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x):
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        x = x.transpose(1, 2).reshape(batch, tokens, dim)
        return self.proj_drop(self.proj(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, drop: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, drop, drop)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.drop2(self.fc2(self.drop1(self.act(self.fc1(self.norm2(x))))))


class ViT(nn.Module):
    def __init__(self, image: int = 32, patch: int = 4, dim: int = 192, depth: int = 4, heads: int = 3,
                 classes: int = 1000, drop: float = 0.0):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.pos_drop = nn.Dropout(drop)
        self.blocks = nn.Sequential(*[Block(dim, heads, drop) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head_drop = nn.Dropout(drop)
        self.head = nn.Linear(dim, classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pos_drop(x + self.pos_embed)
        x = self.norm(self.blocks(x))
        return self.head(self.head_drop(x[:, 0]))


CONTROL = "eager~"
PERTURBATION = 2.0 ** -22


def compiled(model: nn.Module, backend: str):
    name, _, rung = backend.partition(":")
    if name == "eager" or backend == CONTROL:
        return model
    if name == "torch" and rung == "aot_eager":
        return torch.compile(model, backend="aot_eager")
    if name == "torch" and rung == "aot_eager_kiln_decomps":
        from torch._dynamo.backends.common import aot_autograd

        from kiln import _torch
        from kiln.aot.decompositions import decomposition_table
        from kiln.config import config

        def nop(gm, _inputs):
            return _torch.make_boxed_func(gm)

        return torch.compile(model, backend=aot_autograd(
            fw_compiler=nop, bw_compiler=nop, decompositions=decomposition_table(),
            partition_fn=_torch.partition_function(config.partitioner)))
    if name == "kiln":
        import kiln

        return kiln.compile(model, backend=rung or "kiln")
    raise ValueError(f"unknown backend {backend!r}")


def run(program, model: nn.Module, images, labels, *, autocast: bool, seed: int):
    """Loss (a float), the logits and every parameter's gradient, in float64."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # dropout's masks: the same draws for every run of this seed
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = program(images)
        loss = F.cross_entropy(logits.float(), labels)
    loss.backward()
    gradients = torch.cat([p.grad.detach().double().flatten() for p in model.parameters()])
    return float(loss.detach().double()), logits.detach().double(), gradients


def _rms(values: list) -> float:
    return math.sqrt(statistics.fmean(value * value for value in values))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--dim", type=int, default=192)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--patch", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--backends",
                        default=f"eager,{CONTROL},torch:aot_eager,torch:aot_eager_kiln_decomps,kiln:aot_eager,kiln")
    parser.add_argument("--summary-only", action="store_true", help="print the summary rows, not one row per seed")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = ViT(args.image, args.patch, args.dim, args.depth, args.heads, drop=args.dropout).train()
    reference = copy.deepcopy(model).double()
    backends = args.backends.split(",")
    programs = {backend: compiled(model, backend) for backend in backends}
    print(f"ViT dim {args.dim} depth {args.depth} heads {args.heads}, "
          f"batch {args.batch} x 3x{args.image}x{args.image}, patch {args.patch}, dropout {args.dropout}; "
          f"torch {torch.__version__}; CPU bf16 autocast")
    print("| seed | float64 loss | " + " | ".join(f"{b}: loss / logits / grads" for b in backends) + " |")
    print("|---|---|" + "---|" * len(backends))
    loss_errors: dict = {b: [] for b in backends}  # signed: loss - float64's
    grad_errors: dict = {b: [] for b in backends}
    logit_errors: dict = {b: [] for b in backends}
    exact_losses = []
    for seed in range(args.seeds):
        generator = torch.Generator().manual_seed(1000 + seed)
        images = torch.randn(args.batch, 3, args.image, args.image, generator=generator)
        labels = torch.randint(0, 1000, (args.batch,), generator=generator)
        perturbed = images * (1 + PERTURBATION * torch.randn(images.shape, generator=generator))
        batches = {False: images, True: perturbed}  # by "is this eager~"
        references = {False: run(reference, reference, images.double(), labels, autocast=False, seed=seed)}
        if CONTROL in backends:  # float64 on the very batch eager~ gets
            references[True] = run(reference, reference, perturbed.double(), labels, autocast=False, seed=seed)
        exact_losses.append(references[False][0])
        cells = []
        for backend in backends:
            exact, exact_logits, exact_grads = references[backend == CONTROL]
            loss, logits, grads = run(programs[backend], model, batches[backend == CONTROL], labels, autocast=True,
                                      seed=seed)
            loss_errors[backend].append(loss - exact)
            logit_errors[backend].append(float((logits - exact_logits).norm() / exact_logits.norm()))
            grad_errors[backend].append(float((grads - exact_grads).norm() / exact_grads.norm()))
            cells.append(f"{loss_errors[backend][-1]:+.3g} / {logit_errors[backend][-1]:.4g} / "
                         f"{grad_errors[backend][-1]:.4g}")
        if not args.summary_only:
            print(f"| {seed} | {exact_losses[-1]:.6f} | " + " | ".join(cells) + " |", flush=True)
    absolute = {b: [abs(error) for error in loss_errors[b]] for b in backends}
    for label, summary in (("median", statistics.median), ("rms", _rms)):
        print(f"| {label} | | " + " | ".join(
            f"{summary(absolute[b]):.3g} / {summary(logit_errors[b]):.4g} / {summary(grad_errors[b]):.4g}"
            for b in backends) + " |")
    if "eager" in backends:
        eager = loss_errors["eager"]
        # benchmarks.run's rule for the loss (kiln.testing.compare on a float32 scalar) against eager's error
        allowed = [2 * abs(error) + 16 * torch.finfo(torch.float32).eps * abs(exact)
                   for error, exact in zip(eager, exact_losses)]
        rejected = {b: sum(abs(error) > bound for error, bound in zip(loss_errors[b], allowed)) for b in backends}
        print("| loss rejected by the 2x-eager rule | | " + " | ".join(
            f"{rejected[b]} of {args.seeds}" for b in backends) + " |")
        if args.seeds > 2:
            print("| loss error's correlation with eager's | | " + " | ".join(
                f"{statistics.correlation(loss_errors[b], eager):.2f}" for b in backends) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
