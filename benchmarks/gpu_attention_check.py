"""Which attention kernel kiln's training graph runs, on CUDA (a diagnosis for BERT's training memory).

    KILN_DEBUG=1 KILN_DEBUG_DIR=/tmp/kt python -m benchmarks.gpu_attention_check [--model bert]

Compiles one training step of the model (benchmarks/workloads.py, TARGETS config, bf16 autocast,
dropout active), then prints, from the dumped ATen graphs, every node that names attention, dropout
or a mask, with its dtype and shape annotation: a fused SDPA op (`_scaled_dot_product_*_attention`)
or the math decomposition (bmm, softmax, a dropout mask of the scores' shape). Also prints the
dtypes of the SDPA call's arguments as the frontend traced them, from the torch-level graph.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys

import torch

import kiln
from benchmarks import workloads

_INTERESTING = re.compile(r"attention|dropout|softmax|amax|bmm|mask|_fused_sdp|where", re.IGNORECASE)


class _SdpaArguments(torch.overrides.TorchFunctionMode):
    """Records the shapes and dtypes of the first two SDPA calls' arguments."""

    def __init__(self):
        super().__init__()
        self.seen: list = []

    def __torch_function__(self, function, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if function is torch.nn.functional.scaled_dot_product_attention and len(self.seen) < 2:
            self.seen.append([(tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else value
                              for value in (*args, *kwargs.values())])
        return function(*args, **kwargs)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert")
    parser.add_argument("--lines", type=int, default=60)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="the shrunk workload (a CPU check of this script)")
    args = parser.parse_args(argv)
    debug_dir = kiln.config.debug_dir
    workload = workloads.build("models", args.model, small=args.small, device=args.device)
    model = workload.program.train()
    compiled = kiln.compile(model)
    with torch.autocast(args.device, dtype=torch.bfloat16):
        output = compiled(*workload.train_args, **workload.train_kwargs)
        loss = workload.loss_of(output)
    loss.backward()
    if args.device == "cuda":
        torch.cuda.synchronize()
    probe = _SdpaArguments()
    with torch.autocast(args.device, dtype=torch.bfloat16), probe:  # eager, for the arguments its SDPA gets
        workload.loss_of(model(*workload.train_args, **workload.train_kwargs))
    seen = probe.seen
    print("eager SDPA arguments (first two calls):", seen)
    for path in sorted(glob.glob(os.path.join(debug_dir, "*", "graph_*", "aten_graph.py"))):
        print("==", path)
        shown = 0
        with open(path) as handle:
            for line in handle:
                if _INTERESTING.search(line) and "Annotation" not in line:
                    print("  " + line.strip()[:220])
                    shown += 1
                    if shown >= args.lines:
                        break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
