"""Which attention kernel kiln's training graph runs, on CUDA (a diagnosis for BERT's training memory).

    KILN_DEBUG=1 KILN_DEBUG_DIR=/tmp/kt python -m benchmarks.gpu_attention_check [--model bert]

Compiles one training step of the model (benchmarks/workloads.py, TARGETS config, bf16 autocast,
dropout active), then prints, from the dumped ATen graphs, every node that names attention, dropout
or a mask, with its dtype and shape annotation: a fused SDPA op (`_scaled_dot_product_*_attention`)
or the math decomposition (bmm, softmax, a dropout mask of the scores' shape). Also prints the
SDPA calls' arguments as kiln's frontend traced them (dtype, shape, strides, from the torch-level
graph handed to kiln/aot) and as eager calls them, and, on CUDA, asks torch's own checks
(`torch.backends.cuda.can_use_{flash,efficient}_attention(..., debug=True)`, which warn with the
reason) whether the fused kernels accept tensors of those dtypes, shapes and strides.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys

import torch

import kiln
import kiln.aot
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


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)}:{tuple(value.stride())}:{str(value.dtype).replace('torch.', '')}"
    return repr(value)


def _traced_sdpa_calls(gm) -> list:
    """(args, kwargs) of the torch-level graph's SDPA calls, fake tensors for tensor arguments."""
    calls = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and "scaled_dot_product_attention" in str(node.target):
            def value(arg):
                return arg.meta.get("example_value", arg.meta.get("val")) if isinstance(arg, torch.fx.Node) else arg
            calls.append(([value(a) for a in node.args], {k: value(v) for k, v in node.kwargs.items()}))
    return calls


def _ask_fused_checks(args: list, kwargs: dict, device: str, autocast_dtype) -> None:
    """Real tensors with the traced dtypes (cast as autocast would), shapes and strides, put to torch's checks."""
    def real(value):
        if isinstance(value, torch.Tensor):
            dtype = autocast_dtype if value.dtype == torch.float32 and autocast_dtype is not None else value.dtype
            return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=dtype, device=device)
        return value
    q, k, v = (real(a) for a in args[:3])
    mask = real(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))
    dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
    causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
    print("  as autocast would cast them:", [_describe(t) for t in (q, k, v, mask)], "dropout", dropout, "causal", causal)
    params = torch.backends.cuda.SDPAParams(q, k, v, mask, float(dropout), bool(causal), False)
    import warnings
    for name in ("flash", "efficient"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = getattr(torch.backends.cuda, f"can_use_{name}_attention")(params, True)
        print(f"  can_use_{name}_attention: {ok}", "; ".join(str(w.message)[:200] for w in caught))


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
    traced: list = []
    original_aot_compile = kiln.aot.aot_compile

    def recording_aot_compile(gm, example_inputs, *rest, **kw):
        traced.extend(_traced_sdpa_calls(gm))
        return original_aot_compile(gm, example_inputs, *rest, **kw)

    kiln.aot.aot_compile = recording_aot_compile  # kiln/backend.py imports it at each compile
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
    print(f"kiln's traced SDPA calls: {len(traced)}")
    for args_, kwargs_ in traced[:2]:
        print(" traced:", [_describe(a) for a in args_], {k: _describe(v) for k, v in kwargs_.items()})
        if args.device == "cuda":
            _ask_fused_checks(args_, kwargs_, args.device, torch.bfloat16)
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
