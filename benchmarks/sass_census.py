"""Every CUDA kernel kiln generates for a TARGETS.md model, compiled for sm_90 on a machine without a GPU.

    TRITON_INTERPRET=1 python -m benchmarks.sass_census [--only bert,resnet50] [--batch-scale 8]
        [--train] [--set conv_layout_training=1]

On the H200 a fused pointwise or row kernel is bound by instruction issue once it needs more than about
25 SASS instructions an element (tests/codegen/test_gpu_compile.py test_row_kernels_stay_within_their_instruction_
budget says why), so the instruction count of each kernel, at the model's real sizes, finds the slow ones without
a GPU. Each model is built from its default config (Llama: TARGETS.md's), traced on CPU tensors under bf16
autocast with the Triton backend, conv nets channels-last as on CUDA, and each distinct kernel is generated for
CUDA and compiled by Triton for sm_90; its cubin's instructions are counted (Triton's cuobjdump).

The graph runs once to be compiled, with every generated kernel's launch skipped (Triton's interpreter would take
hours at these sizes): the values are garbage, only the kernels' sources matter. The ATen calls (products,
convolutions) run for real on the CPU, which is why the batch is the model's TARGETS.md batch divided by
--batch-scale. A kernel's instructions per element do not depend on the batch.

Per kernel: instructions per element (the cubin's count over the elements one thread handles: XBLOCK x RBLOCK
over the threads of a program), launches per forward, and elements per launch. A kernel with a loop (a looped
reduction, a product template) is marked: its static count is not per element.
"""
from __future__ import annotations

import argparse
import os

import torch

ISSUE_BUDGET = 25  # SASS instructions an element above which a bf16 row kernel falls under 0.9 of the H200's ceiling


def _models(batch_scale: int) -> dict:
    """name -> (model, example args, config options): TARGETS.md's six models where the CPU has them."""
    import transformers

    from benchmarks.kernel_counts import resnet50_shaped

    def tokens(vocab, batch, seq):
        return (torch.randint(0, vocab, (max(1, batch // batch_scale), seq)),)

    def images(batch):
        return (torch.randn(max(1, batch // batch_scale), 3, 224, 224),)

    llama = transformers.LlamaConfig(num_hidden_layers=8, hidden_size=1024, num_attention_heads=16,
                                     num_key_value_heads=8, intermediate_size=2816, vocab_size=32000,
                                     max_position_embeddings=2048)
    return {
        "bert": (lambda: transformers.BertModel(transformers.BertConfig()), tokens(30522, 8, 512), {}),
        "gpt2": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config()), tokens(50257, 8, 512), {}),
        "llama": (lambda: transformers.LlamaForCausalLM(llama), tokens(32000, 4, 1024), {}),
        "vit": (lambda: transformers.ViTModel(transformers.ViTConfig()), images(64), {}),  # ViT-B/16's architecture
        "resnet50": (lambda: resnet50_shaped(scale=1), images(64), {"conv_layout": "channels_last"}),
    }


def census(make_model, args: tuple, options: dict, train: bool = False) -> list[dict]:
    """One row per distinct CUDA kernel of the model's inference graphs (see the module docstring); with `train`,
    of its training step's forward and backward graphs (train mode, the loss the output's float32 sum)."""
    import kiln
    from kiln import _triton, backend
    from kiln.codegen.triton import generate_kernel
    from tests.codegen.test_gpu_compile import sass_instructions

    model = make_model().train(train)
    graphs = []  # what kiln.compile's graphs compiled to (kiln's frontend, as users run it)
    compile_aten_graph = backend._compile_aten_graph

    def recording(*arguments, **keywords):
        compiled, key = compile_aten_graph(*arguments, **keywords)
        graphs.append(compiled)
        return compiled, key

    backend._compile_aten_graph = recording
    try:
        with _triton.interpreted_launches_skipped(), torch.set_grad_enabled(train), \
                torch.autocast("cpu", dtype=torch.bfloat16), \
                kiln.config.patch(cpu_backend="triton", graph_cache=False, **options):
            result = kiln.compile(model)(*args)
            if train:  # the backward graph compiles at its first call
                result.float().sum().backward()
    finally:
        backend._compile_aten_graph = compile_aten_graph
    distinct: dict = {}
    for graph in graphs:
        for kernel in graph.scheduled.kernels:
            source = generate_kernel(kernel, graph.scheduled.graph, "cuda")
            distinct.setdefault(source.source, []).append(source)
    firsts = [launches[0] for launches in distinct.values()]
    rows = []
    for source, count, launches in zip(firsts, sass_instructions(firsts, errors=True), distinct.values()):
        if isinstance(count, str):  # failed Triton's compile: on a GPU, its graph would run eagerly
            rows.append({"kernel": source.function_name, "instructions": 0, "per_element": 0.0,
                         "launches": len(launches), "elements": int(source.xnumel), "looped": False, "error": count})
            continue
        block = source.constexprs
        per_thread = max(1, block.get("XBLOCK", 1) * block.get("RBLOCK", 1) // (32 * source.num_warps))
        rows.append({"kernel": source.function_name, "instructions": count, "per_element": count / per_thread,
                     "launches": len(launches), "elements": int(source.xnumel),
                     "looped": source.constexpr_values is not None or "for " in source.source})
    return sorted(rows, key=lambda row: -row["per_element"] * row["elements"] * row["launches"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sass_census", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated models (default: all)")
    parser.add_argument("--batch-scale", type=int, default=8, help="the TARGETS.md batch divided by this")
    parser.add_argument("--train", action="store_true", help="a training step's kernels (forward and backward)")
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                        help="a kiln.config option for the compile, e.g. conv_layout_training=1 (repeatable)")
    args = parser.parse_args(argv)
    settings = {}
    for item in args.set:
        option, _, value = item.partition("=")
        settings[option] = {"1": True, "0": False, "true": True, "false": False}.get(value.lower(), value)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    models = _models(args.batch_scale)
    for name in [name for name in models if not args.only or name in args.only.split(",")]:
        make_model, inputs, options = models[name]
        rows = census(make_model, inputs, {**options, **settings}, train=args.train)
        issued = sum(row["per_element"] * row["elements"] * row["launches"] for row in rows if not row["looped"])
        over = [row for row in rows if not row["looped"] and row["per_element"] > ISSUE_BUDGET
                and row["elements"] >= 1 << 20]
        failed = [row for row in rows if "error" in row]
        print(f"\n## {name}{' (training step)' if args.train else ''}{''.join(f', {item}' for item in args.set)}: "
              f"{sum(row['launches'] for row in rows)} launches of {len(rows)} distinct kernels; "
              f"**{len(failed)} failed Triton's compile**; {len(over)} of at least 2^20 elements over {ISSUE_BUDGET} "
              f"instructions an element; {issued / 1e9:.2f} G thread-instructions (per element x elements x "
              f"launches) in the kernels without a loop\n")
        for row in failed:
            print(f"- {row['kernel']} ({row['launches']} launches, {row['elements']} rows): {row['error']}")
        print("\n| kernel | SASS instructions | per element | launches | elements per launch | loop |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            if "error" not in row:
                print(f"| {row['kernel']} | {row['instructions']} | {row['per_element']:.1f} | {row['launches']} | "
                      f"{row['elements']} | {'yes' if row['looped'] else ''} |", flush=True)


if __name__ == "__main__":
    main()
