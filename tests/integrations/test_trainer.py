"""Hugging Face Trainer with a kiln-compiled model, as its users pass one: losses equal an uncompiled run's.

The model is compiled before it is handed to Trainer (Accelerate's `dynamo_backend` and Trainer's
`torch_compile_backend` accept only their own list of backend names, which kiln's is not on), with
Trainer's defaults otherwise: `remove_unused_columns=True` keeps the dataset keys that the model's
forward signature names, which kiln's compiled forward must expose (it once dropped every column).
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


class TokenDataset(torch.utils.data.Dataset):
    """Causal-LM examples as Trainer takes them: dicts of input_ids and labels, plus a column no forward takes."""

    def __init__(self, count: int, length: int, vocab: int):
        generator = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(0, vocab, (length,), generator=generator) for _ in range(count)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.rows[index], "labels": self.rows[index], "note_for_humans": index}


def train(compiled: bool, tmp_path) -> tuple[list[float], object]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128)  # defaults otherwise
    model = transformers.GPT2LMHeadModel(config)
    model = kiln.compile(model) if compiled else model
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path / ("kiln" if compiled else "eager")), max_steps=3, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0,
        dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=TokenDataset(16, 32, 128))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return losses, model


def test_trainer_trains_a_kiln_compiled_model_with_its_default_arguments(tmp_path):
    with kiln.testing.philox_draws():  # GPT-2's default dropout: the eager run draws kiln's masks
        eager_losses, _ = train(False, tmp_path)
    with kiln.config.patch(strict=True):  # a graph kiln cannot compile fails the test, not runs eagerly
        kiln_losses, model = train(True, tmp_path)
    assert len(kiln_losses) == len(eager_losses) == 3
    assert kiln_losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-5)
    assert isinstance(model, kiln.OptimizedModule)
    entries = model._compiled_call.entries if hasattr(model._compiled_call, "entries") else []
    assert entries and all(entry.eager_reason is None for entry in entries)  # compiled, not run eagerly
