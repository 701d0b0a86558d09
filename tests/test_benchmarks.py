"""benchmarks/train_memory.py on the CPU: it measures what eager and kiln save for a training step's
backward (peaks are CUDA-only) and what kiln's compiled forward returns."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")


def test_train_memory_measures_saved_values_of_eager_and_kiln():
    from benchmarks.train_memory import measure

    eager = measure("bert", "eager", small=True, device="cpu")
    compiled = measure("bert", "kiln", small=True, device="cpu")
    assert eager["saved"] > 0 and compiled["saved"] > 0
    assert sum(compiled["outputs"].values()) > 0 and not eager["outputs"]
    assert compiled["phases"].cell("forward") == "-"  # no CUDA allocator on a CPU


def test_a_training_case_judges_its_loss_and_its_gradients_apart(monkeypatch):
    """benchmarks/case.py check_accuracy: a training result (loss, gradients) gets one verdict each, so a
    failing loss does not hide whether the gradients pass (and the other way round)."""
    import torch

    from benchmarks import case

    reference = (torch.tensor(2.0, dtype=torch.float64),
                 [torch.linspace(-1, 1, 64, dtype=torch.float64), torch.linspace(0, 3, 32, dtype=torch.float64)])
    eager = (torch.tensor(2.0 + 1e-6), [gradient.float() + 1e-6 for gradient in reference[1]])

    class Result:
        device = "cpu"

        def __init__(self, value):
            self.value = value

        def result_for_checking(self):
            return self.value

    monkeypatch.setattr(case, "float64_reference", lambda workload, mode, device: reference)
    off_loss = (torch.tensor(2.1), eager[1])
    verdict = case.check_accuracy(None, Result(off_loss), Result(eager), "train")
    assert not verdict["accuracy_ok"] and not verdict["loss_accuracy_ok"] and verdict["gradients_accuracy_ok"]
    assert verdict["accuracy"].startswith("loss: ") and "gradients (2): ok" in verdict["accuracy"]

    off_gradient = (eager[0], [eager[1][0], eager[1][1] + 0.5])
    verdict = case.check_accuracy(None, Result(off_gradient), Result(eager), "train")
    assert verdict["loss_accuracy_ok"] and not verdict["gradients_accuracy_ok"]
    assert "loss: ok" in verdict["accuracy"] and "output 1" in verdict["accuracy"]

    verdict = case.check_accuracy(None, Result(eager), Result(eager), "train")
    assert verdict["accuracy_ok"] and verdict["accuracy"] == "ok"
