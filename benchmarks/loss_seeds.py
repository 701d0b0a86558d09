"""A training loss's error against float64 over several inputs, for eager, torch.compile and kiln.

    python -m benchmarks.loss_seeds --model vit --seeds 6 [--backends eager,inductor,kiln,kiln:aot_eager]

benchmarks.run judges a training loss by one draw: the loss of one batch, whose error against a
float64 run of the same model is the sum of many bf16 roundings. This asks whether a backend's error
is larger than eager's on every batch (a real loss of precision) or only on some (the spread of
rounding). Each seed draws new images and labels into the workload's own tensors (the compiled
graphs see the same shapes: no recompile); each backend runs the forward, the loss and the backward
under bf16 autocast, as benchmarks.run's training mode does. Prints one row per seed and the median
error per backend; writes nothing else. `kiln:<rung>` compiles with kiln's frontend and a rung of its
backend ladder (`kiln.compile(..., backend="aot_eager")`: AOTAutograd and kiln's decompositions, the graphs
run by torch), which tells a loss of precision in kiln's kernels from one before them.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys

import torch

from benchmarks import workloads
from benchmarks.case import compile_program


def _loss(program, workload, device: str, autocast: bool) -> float:
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        loss = workload.loss_of(program(*workload.train_args))
    loss.backward()
    return float(loss.detach().double())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit")
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--backends", default="eager,inductor,kiln")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on a CPU: the small model, to check the script
    workload = workloads.build("models", args.model, small=device == "cpu", device=device)
    workload.program.train(True)
    reference_model = copy.deepcopy(workload.program).double()
    backends = args.backends.split(",")
    programs = {}
    for backend in backends:
        name, _, rung = backend.partition(":")
        programs[backend] = workload.program if name == "eager" else \
            compile_program(workload.program, name, "train", rung or "kiln")
    (images,) = workload.train_args
    errors: dict = {backend: [] for backend in backends}
    print(f"{args.model}: loss error against float64, bf16 autocast, forward + loss + backward")
    print("| seed | float64 loss | " + " | ".join(f"{backend} error" for backend in backends) + " |")
    print("|---|---|" + "---|" * len(backends))
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        images.normal_()
        cells = dict(zip(workload.loss_of.__code__.co_freevars, workload.loss_of.__closure__))
        cells["labels"].cell_contents.random_(0, 10)  # the labels tensor the loss closes over
        reference = copy.copy(workload)
        reference.train_args = (images.double(),)
        exact = _loss(reference_model, reference, device, autocast=False)
        row = []
        for backend in backends:
            error = abs(_loss(programs[backend], workload, device, autocast=True) - exact)
            errors[backend].append(error)
            row.append(f"{error:.3g}")
        print(f"| {seed} | {exact:.6f} | " + " | ".join(row) + " |", flush=True)
    print("| median | | " + " | ".join(f"{statistics.median(errors[b]):.3g}" for b in backends) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
