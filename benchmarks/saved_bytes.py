"""What a training graph's forward saves for its backward, by partitioner (kiln.config.partitioner).

    python -m benchmarks.saved_bytes [--models bert,gpt2,llama] [--batch 4] [--length 128]

Each model is built from its transformers config's defaults, shrunk (2 layers, width 128, vocab 1000,
as the CPU model tests do), in train mode (dropout active), and trained one step through
`kiln.compile(model, backend="aot_eager")` (kiln's capture and AOTAutograd, torch running the ATen
graphs) under each partitioner. The forward ATen graph's outputs are the model's outputs plus every
value saved for the backward: their count and bytes are reported, with the loss (equal under both:
same seed). Deterministic (no timing), so it runs anywhere; results go to
benchmarks/results/<date>_saved-bytes_<hardware>.md.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys

import torch

from benchmarks import report

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTITIONERS = ("default", "min_cut")


def build(name: str) -> torch.nn.Module:
    import transformers

    if name == "bert":
        return transformers.BertForMaskedLM(transformers.BertConfig(
            hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, vocab_size=1000))
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=1000))
    if name == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=256, vocab_size=1000))
    raise SystemExit(f"unknown model {name!r}: bert, gpt2, llama")


@contextlib.contextmanager
def forward_graph_outputs():
    """Within the block, each forward ATen graph kiln compiles appends its outputs' metas (model outputs and
    the values saved for the backward; None for a non-tensor output) to the list yielded."""
    from kiln import _torch

    recorded: list = []
    original = _torch.aot_module_simplified

    def recording(gm, inputs, **options):
        forward = options["fw_compiler"]

        def record(aten_gm, aten_inputs):
            outputs = next(node for node in aten_gm.graph.nodes if node.op == "output").args[0]
            recorded.append([getattr(node, "meta", {}).get("val") for node in outputs])
            return forward(aten_gm, aten_inputs)

        return original(gm, inputs, **{**options, "fw_compiler": record})

    _torch.aot_module_simplified = recording
    try:
        yield recorded
    finally:
        _torch.aot_module_simplified = original


def tensor_bytes(values: list) -> int:
    return sum(value.numel() * value.element_size() for value in values if isinstance(value, torch.Tensor))


def forward_outputs(name: str, partitioner: str, batch: int, length: int) -> tuple[int, int, float]:
    """(outputs, bytes) of the forward graph of one training step, and the step's loss."""
    import kiln

    torch.manual_seed(0)
    model = build(name).train()
    ids = torch.randint(0, 1000, (batch, length))
    with forward_graph_outputs() as recorded, kiln.config.patch(partitioner=partitioner):
        output = kiln.compile(model, backend="aot_eager")(input_ids=ids, labels=ids)
        output.loss.backward()
    return len(recorded[0]), tensor_bytes(recorded[0]), float(output.loss)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.saved_bytes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,gpt2,llama")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.saved_bytes " + " ".join(shlex.quote(arg) for arg in (argv or sys.argv[1:]))
    env = report.environment("cpu", REPO_ROOT, command)
    lines = report.text_header(
        "Forward outputs of a training step (model outputs + values saved for the backward), by partitioner", env,
        __doc__)
    lines += ["| model | partitioner | forward outputs | MB | loss |", "|---|---|---:|---:|---:|"]
    for name in report.names(args.models):
        for partitioner in PARTITIONERS:
            count, size, loss = forward_outputs(name, partitioner, args.batch, args.length)
            lines.append(f"| {name} | {partitioner} | {count} | {size / 1e6:.1f} | {loss:.6f} |")
            print(lines[-1], flush=True)
    if not args.no_write:
        print("wrote " + report.write_text_result("saved-bytes", env, lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
