"""Accelerate with a kiln-compiled model, as its users write a loop: losses equal an uncompiled run's.

Accelerate's `dynamo_backend` takes only its own list of backend names, so the model is compiled
first and handed to `Accelerator.prepare` (README, "Integrations"); `unwrap_model` treats kiln's wrapper
as it treats torch.compile's OptimizedModule.
"""
from __future__ import annotations

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")


def train(compiled: bool) -> tuple[list[float], object, object]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, vocab_size=128)
    original = transformers.LlamaForCausalLM(config)  # defaults otherwise: the cache, dropout settings
    model = kiln.compile(original) if compiled else original
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 128, (12, 24), generator=generator)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(rows), batch_size=4)
    accelerator = accelerate.Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for (batch,) in loader:
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, (accelerator, model), original


def test_accelerate_trains_a_kiln_compiled_model():
    eager_losses, _, _ = train(False)
    with kiln.config.patch(strict=True):  # a graph kiln cannot compile fails the test, not runs eagerly
        kiln_losses, (accelerator, prepared), original = train(True)
    assert len(kiln_losses) == len(eager_losses) == 3
    assert kiln_losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-5)
    entries = prepared._compiled_call.entries if hasattr(prepared._compiled_call, "entries") else []
    assert entries and all(entry.eager_reason is None for entry in entries)  # compiled, not run eagerly
    # as for torch.compile's OptimizedModule: kept by default, seen through on request (its _orig_mod)
    assert accelerator.unwrap_model(prepared) is prepared
    assert accelerator.unwrap_model(prepared, keep_torch_compile=False) is original
