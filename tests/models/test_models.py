"""Tiny real models compiled end to end: transformers' BERT, GPT-2 and Llama, and a ResNet.

Each model is built from a small config with random weights (no downloads; GPT-2 and Llama with
their default cache, so the forward builds a DynamicCache), compiled
whole with `kiln.compile(model, backend=BACKEND)`, asserted to be compiled (no frame or graph
run eagerly: a fallback is not a pass), and checked with kiln's accuracy rule:
the compiled result must be no farther from a float64 reference (the same model in
float64 on the same inputs) than eager's result is. Training tests check the loss and
every parameter's gradient, and the BatchNorm running statistics a training step updates.

BACKEND is a rung of kiln's ladder, from $KILN_TEST_BACKEND: "kiln" (default: the whole
compiler), "aot_eager" or "eager" (bisect a failure down the ladder). Shapes are tiny so
that the file runs in minutes with Triton kernels under the interpreter on a CPU.
"""
from __future__ import annotations

import contextlib
import copy
import os

import pytest
import torch
import torch.nn.functional as F

import kiln
from benchmarks.workloads import BasicBlock  # the benchmarks' residual block, one definition
from kiln.debug.explain import ExplainReport, _recording
from kiln.testing import compare, to_float64

transformers = pytest.importorskip("transformers")

BACKEND = os.environ.get("KILN_TEST_BACKEND", "kiln")
pytestmark = pytest.mark.models

BATCH, SEQ, VOCAB = 2, 16, 100


# --------------------------------------------------------------------------- checks

@contextlib.contextmanager
def compiles_whole(model: torch.nn.Module):
    """A fallback is not a pass: the block must compile the model as one graph per frame, with no graph
    break, no frame or graph run eagerly, and (on the full backend) with kernels generated."""
    report = ExplainReport()
    with _recording(report):
        yield
    name = type(model).__name__
    eager = [warning for warning in report.warnings if "runs eagerly" in warning]
    assert not eager, f"{name}: {eager[0][:500]}"
    assert not report.eager_frames, f"{name}: {report.eager_frames[0].eager_reason[:500]}"
    assert not report.breaks, f"{name}: graph break: {report.breaks[0].reason[:300]} at {report.breaks[0].location}"
    assert report.graphs, f"{name}: no graph was captured"
    fallbacks = [graph.fallback for graph in report.graphs if graph.fallback is not None]
    assert not fallbacks, f"{name}: a graph ran eagerly: {fallbacks[0][:500]}"
    if BACKEND == "kiln":
        assert sum(graph.kernels or 0 for graph in report.graphs) > 0, f"{name}: no kernel was generated"


def assert_inference_matches(model: torch.nn.Module, *args, **kwargs) -> None:
    """Compiled inference == eager, judged against a float64 copy of the model."""
    model.eval()
    reference_model = copy.deepcopy(model).to(torch.float64)
    compiled = kiln.compile(model, backend=BACKEND)
    with torch.no_grad():
        eager = model(*args, **kwargs)
        with compiles_whole(model):
            actual = compiled(*args, **kwargs)
        reference = reference_model(*to_float64(args), **to_float64(kwargs))
    verdict = compare(actual, eager, reference)
    assert verdict, f"{type(model).__name__} inference with backend={BACKEND!r}: {verdict.message}"


def _loss_and_gradients(model: torch.nn.Module, run, args, kwargs, loss_of):
    """One training step without an optimizer: (loss, gradients, buffers) after forward + backward."""
    model.zero_grad(set_to_none=True)
    loss = loss_of(run(*args, **kwargs))
    loss.backward()
    gradients = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    buffers = [b.detach().clone() for b in model.buffers()]
    return loss.detach(), gradients, buffers


def assert_training_matches(model: torch.nn.Module, loss_of, *args, **kwargs) -> None:
    """Compiled forward + backward == eager: loss, every gradient, every updated buffer."""
    model.train()
    eager_model, compiled_model, reference_model = model, copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = kiln.compile(compiled_model, backend=BACKEND)
    eager = _loss_and_gradients(eager_model, eager_model, args, kwargs, loss_of)
    with compiles_whole(model):
        actual = _loss_and_gradients(compiled_model, compiled, args, kwargs, loss_of)
    reference = _loss_and_gradients(reference_model, reference_model, to_float64(args), to_float64(kwargs), loss_of)
    for part, position in (("loss", 0), ("gradients", 1), ("buffers", 2)):
        verdict = compare(actual[position], eager[position], reference[position])
        assert verdict, f"{type(model).__name__} training {part} with backend={BACKEND!r}: {verdict.message}"


# --------------------------------------------------------------------------- models

def tokens(batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq))


def tiny_bert():
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertModel(config)


def tiny_gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    return transformers.GPT2LMHeadModel(config)


def tiny_llama():
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=176, vocab_size=VOCAB,
                                      max_position_embeddings=64, attention_dropout=0.0)
    return transformers.LlamaForCausalLM(config)


class TinyResNet(torch.nn.Module):
    """Stem, two residual blocks (one downsampling), max and average pooling, a linear head."""

    def __init__(self, width: int = 8, num_classes: int = 10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(width), torch.nn.ReLU(),
                                        torch.nn.MaxPool2d(2))
        self.blocks = torch.nn.Sequential(BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2))
        self.head = torch.nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def images() -> torch.Tensor:
    return torch.randn(BATCH, 3, 16, 16)


def _set_batchnorm_statistics(model: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial running statistics, so eval-mode BatchNorm does more than scale by ~1."""
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 1.5)
            torch.nn.init.uniform_(module.weight, 0.5, 1.5)
            torch.nn.init.uniform_(module.bias, -0.5, 0.5)
    return model


# --------------------------------------------------------------------------- tests

def test_bert_inference_with_padding_mask():
    input_ids = tokens()
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -5:] = 0  # the second sequence is padded
    assert_inference_matches(tiny_bert(), input_ids=input_ids, attention_mask=attention_mask)


def test_gpt2_inference():
    assert_inference_matches(tiny_gpt2(), input_ids=tokens())


def test_llama_inference():
    assert_inference_matches(tiny_llama(), input_ids=tokens())


def test_resnet_inference():
    assert_inference_matches(_set_batchnorm_statistics(TinyResNet()), images())


def test_llama_training():
    input_ids = tokens()
    assert_training_matches(tiny_llama(), lambda output: output.loss, input_ids=input_ids, labels=input_ids)


def test_resnet_training_updates_batchnorm_statistics():
    labels = torch.randint(0, 10, (BATCH,))
    assert_training_matches(_set_batchnorm_statistics(TinyResNet()),
                            lambda logits: F.cross_entropy(logits, labels), images())
