"""`generate()` with the KV cache through a compiled forward, as users write it.

`model.forward = kiln.compile(model.forward)`, then greedy `model.generate(...)` for 32 new
tokens with the model's DEFAULT config (its DynamicCache): the tokens must be eager's, no
frame may run eagerly, and the number of compiles stays bounded (the prefill, the first decode
step, then one shape-generic decode graph: automatic dynamic shapes), never one per token.
"""
from __future__ import annotations

import os

import pytest
import torch

import kiln
from kiln.debug.explain import ExplainReport, _recording

transformers = pytest.importorskip("transformers")
BACKEND = os.environ.get("KILN_TEST_BACKEND", "kiln")
pytestmark = pytest.mark.models


def _llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, vocab_size=100)
    return transformers.LlamaForCausalLM(config).eval()


def test_greedy_generate_matches_eager_with_bounded_compiles():
    model = _llama()
    prompt = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    model.forward = kiln.compile(model.forward, backend=BACKEND)
    report = ExplainReport()
    with torch.no_grad(), _recording(report):
        actual = model.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    assert torch.equal(actual, expected)
    assert not report.eager_frames, report.eager_frames[0].eager_reason[:500]
    assert not any("runs eagerly" in warning or "recompile limit" in warning for warning in report.warnings)
    assert len(report.frames) <= 4, f"{len(report.frames)} compiles for 32 tokens"
