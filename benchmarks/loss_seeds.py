"""A training loss's error against float64 over several inputs, for eager, torch.compile and kiln.

    python -m benchmarks.loss_seeds --model vit --seeds 6 [--backends eager,eager~,inductor,kiln,kiln:aot_eager]

benchmarks.run judges a training loss by one draw: the loss of one batch, whose error against a
float64 run of the same model is the sum of many bf16 roundings. This asks whether a backend's error
is larger than eager's on every batch (a real loss of precision) or only on some (the spread of
rounding). Each seed draws new images and labels into the workload's own tensors (the compiled
graphs see the same shapes: no recompile); each backend runs the forward, the loss and the backward
under bf16 autocast, as benchmarks.run's training mode does. `kiln:<rung>` compiles with kiln's
frontend and a rung of its backend ladder (`kiln.compile(..., backend="aot_eager")`: AOTAutograd and
kiln's decompositions, the graphs run by torch), which tells a loss of precision in kiln's kernels
from one before them.

Per seed and backend it prints the loss's signed error (loss - float64's) and the model output's
relative error, ||out - out64|| / ||out64|| over all its floating values (ViT: the logits). The loss is
one number whose error is mostly the rounding of the logits to bf16: any change upstream, even one
float32 ulp, redraws those roundings, so two equally precise runs give errors that differ batch by batch
(on CPU ViTs, benchmarks.run's rule, |error| at most twice eager's, rejected eager itself on a perturbed
batch on 10% to 37% of batches: benchmarks/results/2026-12-04_vit-precision-cpu-6ea47cb.md). The output
has thousands of values: a backend that loses precision shows a larger output error than eager's on
every batch.

`eager~` is the yardstick for that spread: eager on the same batch times (1 + 2^-22 n), n standard
normal (about one float32 ulp), against float64 on that perturbed batch. Its loss errors stray from
eager's about as far as those of a backend that only rounds differently in float32 (kiln's decomposed
LayerNorm against eager's kernel): on a CPU ViT of width 768 the rule rejected eager~ on 6 of 16
batches and kiln's decompositions on 5, at width 192 on 4 and 3 of 40.
It needs a batch large enough for the perturbation to move some bf16 roundings of the input: ViT-B's
64 x 3 x 224 x 224 is; the CPU's small workloads may not be, and then eager~'s numbers are eager's.

Summary rows per backend: median |loss error|, root mean square loss error, the median ratio of its
output error to eager's, and on how many batches benchmarks.run's rule (kiln.testing.compare: |error|
at most 2x eager's plus 16 float32 ulp of the loss) rejects its loss.

Dropout: every run of a batch (float64, eager, each backend) starts from the same torch.manual_seed, so
runs that draw their masks as eager does (kiln's kernels do: torch's generator, eager's order) compare
value for value. On a CPU, the float64 model draws eager's masks too (bernoulli's draws do not depend on
the dtype). On CUDA they need not (flash attention draws its own in the kernel), which is why the
workloads keep every dropout probability at 0 (timm's ViT has 0 by default).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys

import torch

from benchmarks import workloads
from benchmarks.case import compile_program
from kiln.testing import ERROR_FACTOR, ULP_FLOOR

CONTROL = "eager~"
PERTURBATION = 2.0 ** -22
DROPOUT_SEED = 10_000  # + the batch's seed: the generator state every run of that batch starts from


def _run(program, workload, device: str, autocast: bool, seed: int):
    """The loss (a float) and the output's floating values (float64, flattened), after forward + backward."""
    torch.manual_seed(DROPOUT_SEED + seed)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        output = program(*workload.train_args)
        loss = workload.loss_of(output)
    loss.backward()
    return float(loss.detach().double()), torch.cat(_floating_values(output))


def _floating_values(value) -> list:
    """Every floating tensor in a model's output (a tensor, tuple, dict or transformers ModelOutput),
    detached, flattened, in float64."""
    if isinstance(value, torch.Tensor):
        return [value.detach().double().flatten()] if value.is_floating_point() else []
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    if isinstance(value, dict):
        value = [value[key] for key in sorted(value, key=str)]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _floating_values(item)]
    return []


def _relative(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got - exact).norm() / exact.norm().clamp_min(1e-30))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit")
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--backends", default=f"eager,{CONTROL},inductor,kiln")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on a CPU: the small model, to check the script
    workload = workloads.build("models", args.model, small=device == "cpu", device=device)
    workload.program.train(True)
    reference_model = copy.deepcopy(workload.program).double()
    backends = args.backends.split(",")
    if "eager" not in backends:
        backends.insert(0, "eager")  # every ratio and rule is against eager's error
    programs = {}
    for backend in backends:
        name, _, rung = backend.partition(":")
        programs[backend] = workload.program if name in ("eager", CONTROL) else \
            compile_program(workload.program, name, "train", rung or "kiln")
    (images,) = workload.train_args
    loss_errors: dict = {backend: [] for backend in backends}
    output_errors: dict = {backend: [] for backend in backends}
    float64_losses = []
    print(f"{args.model}: error against float64, bf16 autocast, forward + loss + backward; "
          f"per backend: signed loss error / output's relative error")
    print("| seed | float64 loss | " + " | ".join(backends) + " |")
    print("|---|---|" + "---|" * len(backends))
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        images.normal_()
        cells = dict(zip(workload.loss_of.__code__.co_freevars, workload.loss_of.__closure__))
        cells["labels"].cell_contents.random_(0, 10)  # the labels tensor the loss closes over
        batch = images.clone()
        noise = torch.randn(batch.shape, generator=torch.Generator().manual_seed(seed)).to(device)
        perturbed = batch * (1 + PERTURBATION * noise)
        references = {}  # float64 on the very batch a backend gets: the drawn one, or eager~'s perturbed one
        row = []
        for backend in backends:
            images.copy_(perturbed if backend == CONTROL else batch)
            key = backend == CONTROL
            if key not in references:
                reference = copy.copy(workload)
                reference.train_args = (images.double(),)
                references[key] = _run(reference_model, reference, device, autocast=False, seed=seed)
            exact_loss, exact_output = references[key]
            loss, output = _run(programs[backend], workload, device, autocast=True, seed=seed)
            loss_errors[backend].append(loss - exact_loss)
            output_errors[backend].append(_relative(output, exact_output))
            row.append(f"{loss_errors[backend][-1]:+.3g} / {output_errors[backend][-1]:.4g}")
        images.copy_(batch)
        float64_losses.append(references[False][0])
        print(f"| {seed} | {float64_losses[-1]:.6f} | " + " | ".join(row) + " |", flush=True)
    # benchmarks.run's rule for the loss (kiln.testing.compare on a float32 scalar), against eager's error
    allowed = [ERROR_FACTOR[torch.float32] * abs(error) + ULP_FLOOR * torch.finfo(torch.float32).eps * abs(exact)
               for error, exact in zip(loss_errors["eager"], float64_losses)]

    def summary(label: str, cell) -> None:
        print(f"| {label} | | " + " | ".join(cell(backend) for backend in backends) + " |")

    summary("median abs loss error", lambda b: f"{statistics.median(abs(e) for e in loss_errors[b]):.3g}")
    summary("rms loss error", lambda b: f"{statistics.fmean(e * e for e in loss_errors[b]) ** 0.5:.3g}")
    summary("median output error / eager's", lambda b: "{:.4f}".format(
        statistics.median(got / eager for got, eager in zip(output_errors[b], output_errors["eager"]))))
    summary("batches whose loss benchmarks.run rejects",
            lambda b: f"{sum(abs(e) > bound for e, bound in zip(loss_errors[b], allowed))} of {args.seeds}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
