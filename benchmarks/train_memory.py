"""Where a training step's memory goes, eager against kiln: saved values and peaks, per phase.

    python -m benchmarks.train_memory [--models bert,llama] [--small] [--no-write]

One process per backend is not needed here (nothing is timed). For each model (benchmarks/workloads.py:
the TARGETS.md shapes on a GPU, `--small` ones anywhere), in train mode with dropout active and bf16
autocast on CUDA, one warm-up step, then one measured step, for eager and for `kiln.compile`:

- saved MB: the values autograd keeps for the backward, each storage counted once
  (`torch.autograd.graph.saved_tensors_hooks`; for kiln these are the compiled forward's saved
  outputs, which its autograd Function saves);
- kiln's forward outputs: what each compiled forward ATen graph returns (model outputs + values
  saved for the backward), by dtype, recorded as benchmarks/saved_bytes.py records them;
- on CUDA, the allocator's peak during the forward and during the backward, and what is allocated
  after each (`torch.cuda.max_memory_allocated`, reset between phases); "-" on a CPU.

Written to benchmarks/results/<date>_train-memory_<hardware>.md with the date, hardware, versions,
commit and command (issue 16: kiln's BERT training peaked at 5.34 GiB against eager's 2.28 on the H200
at 0df13a9, with less saved than eager's on the CPU).
"""
from __future__ import annotations

import argparse
import collections
import os
import shlex
import sys

import torch

from benchmarks import report
from benchmarks.saved_bytes import forward_graph_outputs, tensor_bytes
from benchmarks.workloads import build

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1024 ** 3


def _saved_bytes(run) -> tuple:
    """run()'s result, and the bytes of the distinct storages autograd saved while it ran."""
    from torch._subclasses.fake_tensor import FakeTensor

    storages: dict = {}

    def pack(tensor):
        if isinstance(tensor, FakeTensor):  # kiln's compile traces the step too: not a value of this run
            return tensor
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = run()
    return result, sum(storages.values())


class _Phases:
    """Peak and allocated bytes per phase on CUDA (None on a CPU)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.values: dict = {}

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def end(self, phase: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.values[phase] = (torch.cuda.max_memory_allocated() / GIB, torch.cuda.memory_allocated() / GIB)

    def cell(self, phase: str) -> str:
        if phase not in self.values:
            return "-"
        peak, after = self.values[phase]
        return f"{peak:.2f} / {after:.2f}"


def measure(name: str, backend: str, small: bool, device: str) -> dict:
    import kiln

    torch.manual_seed(0)
    workload = build("models", name, small, device)
    model = workload.program.train()
    program = kiln.compile(model) if backend == "kiln" else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast(
        "cpu", enabled=False)
    phases = _Phases(device)
    with forward_graph_outputs() as recorded:
        for step in range(2):  # the first compiles (kiln) and warms the allocator; the second is measured
            model.zero_grad(set_to_none=True)
            phases.start()
            with autocast:
                loss, saved = _saved_bytes(lambda: workload.loss_of(program(*workload.train_args,
                                                                            **workload.train_kwargs)))
            phases.end("forward")
            phases.start()
            loss.backward()
            phases.end("backward")
            del loss
    outputs: collections.Counter = collections.Counter()
    for values in recorded:
        for value in values:
            if isinstance(value, torch.Tensor):
                outputs[str(value.dtype).replace("torch.", "")] += tensor_bytes([value])
    return {"saved": saved, "outputs": outputs, "phases": phases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,llama")
    parser.add_argument("--small", action="store_true", help="the shrunk workloads (any device)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    command = "python -m benchmarks.train_memory " + " ".join(shlex.quote(arg) for arg in (argv or sys.argv[1:]))
    env = report.environment(device, REPO_ROOT, command)
    lines = report.text_header("Training step memory, eager against kiln", env, __doc__)
    lines += ["| model | backend | saved MB | kiln forward outputs MB (by dtype) | forward peak / after GiB "
              "| backward peak / after GiB |", "|---|---|---:|---|---|---|"]
    for name in report.names(args.models):
        for backend in ("eager", "kiln"):
            result = measure(name, backend, args.small, device)
            outputs = result["outputs"]
            by_dtype = ", ".join(f"{dtype} {size / 1e6:.1f}" for dtype, size in sorted(outputs.items()))
            total = f"{sum(outputs.values()) / 1e6:.1f} ({by_dtype})" if outputs else "-"
            phases = result["phases"]
            lines.append(f"| {name} | {backend} | {result['saved'] / 1e6:.1f} | {total} | {phases.cell('forward')} "
                         f"| {phases.cell('backward')} |")
            print(lines[-1], flush=True)
    if not args.no_write:
        print("wrote " + report.write_text_result("train-memory", env, lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
