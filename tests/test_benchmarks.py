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
