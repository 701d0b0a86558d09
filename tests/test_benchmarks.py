"""benchmarks on the CPU: train_memory.py measures what eager and kiln save for a training step's
backward (peaks are CUDA-only) and what kiln's compiled forward returns; the training cases, the DDP
benchmark, and gpu_kernel_variants.py's relaunches of kiln's kernels (under Triton's interpreter)."""
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


def test_ddp_benchmark_trains_eager_and_kiln_on_one_and_two_ranks(tmp_path):
    """benchmarks/ddp.py on the CPU (gloo): eager DDP and kiln.compile(DDP(model)) of the small Llama on 1 and 2
    ranks, each case in processes of its own; the report has both world sizes, tokens/s and kiln's losses
    within the float32 tolerance of eager's (about 40 s on 2 cores)."""
    import json
    import os
    import subprocess
    import sys

    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "-m", "benchmarks.ddp", "--small", "--device", "cpu", "--world-sizes", "1,2",
               "--backends", "eager,kiln", "--steps", "2", "--warmup", "1", "--timeout", "240",
               "--results-dir", str(tmp_path)]
    done = subprocess.run(command, cwd=repo_root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (json_path,) = tmp_path.glob("*_ddp-llama-compile-ddp-small_cpu.json")
    assert json_path.with_suffix(".md").exists() and json_path.with_suffix(".log").exists()
    document = json.loads(json_path.read_text())
    assert document["environment"]["git_commit"] and document["environment"]["command"].startswith(
        "python -m benchmarks.ddp --small")
    cases = {(case["backend"], case["world_size"]): case for case in document["cases"]}
    assert set(cases) == {("eager", 1), ("eager", 2), ("kiln", 1), ("kiln", 2)}
    for (backend, world_size), case in cases.items():
        assert case["status"] == "ok", case
        assert case["tokens_per_s"] == world_size * 2 * 16 / (case["median_ms"] / 1000) > 0
        assert case["peak_gib"] == [None] * world_size  # no CUDA allocator on a CPU
        assert len(case["losses"]) == 4  # the first step, the warm-up step, the 2 timed steps
    for world_size in (1, 2):
        kiln_case = cases[("kiln", world_size)]
        assert kiln_case["losses_ok"], kiln_case["loss_check"]
        assert kiln_case["graphs"] == [1] * world_size and kiln_case["graph_breaks"] == [0] * world_size
    assert "scaling_efficiency" in cases[("eager", 2)] and "scaling_efficiency" in cases[("kiln", 2)]
    text = json_path.with_suffix(".md").read_text()
    assert "| kiln DDP | 2 | ok |" in text and "scaling to 2 ranks" in text


def test_ddp_benchmark_reports_a_failed_case_without_crashing():
    """A rank that raised, and a case cut by its timeout, are rows of the report (the others are compared)."""
    from benchmarks import ddp

    def ok_rank(rank, losses, median_ms=10.0):
        return {"status": "ok", "rank": rank, "batch": 2, "seq": 16, "median_ms": median_ms, "p20_ms": median_ms,
                "p80_ms": median_ms, "first_step_s": 1.0, "peak_gib": None, "losses": losses}

    eager = {"backend": "eager", "world_size": 2, **ddp.merge_ranks([ok_rank(0, [4.0, 3.0]), ok_rank(1, [4.1, 3.1])],
                                                                     None, 60)}
    kiln_case = {"backend": "kiln", "world_size": 2, **ddp.merge_ranks(
        [ok_rank(0, [4.0, 3.5], 5.0), ok_rank(1, [4.1, 3.1], 8.0)], None, 60)}
    failed = {"backend": "inductor", "world_size": 2, **ddp.merge_ranks(
        [{"status": "error", "rank": 0, "error": "exit code -9: (no output)"},
         {"status": "error", "rank": 1, "error": "AssertionError: First bucket should be smaller"}], "killed", 60)}
    timed_out = {"backend": "kiln", "world_size": 1, **ddp.merge_ranks(
        [{"status": "timeout", "rank": 0, "error": "exit code -9: (no output)"}], "timeout", 60)}
    cases = [eager, failed, kiln_case, timed_out]
    ddp.derive(cases, "float32")
    assert kiln_case["median_ms"] == 8.0 and kiln_case["speedup"] == 1.25  # the slowest rank's step
    assert kiln_case["losses_ok"] is False and "FAIL" in kiln_case["loss_check"]  # rank 0's 3.5 against 3.0
    assert failed["status"] == "error" and failed["error"].startswith("rank 1: AssertionError")
    assert timed_out["status"] == "timeout" and "killed after 60 s" in timed_out["error"]
    plan = {"backends": ["eager", "inductor", "kiln"], "world_sizes": [1, 2], "form": "compile_ddp",
            "device": "cpu", "kiln_backend": "kiln", "method": "test"}
    env = {"date": "2026-12-04", "gpu": None, "cpu": "cpu", "cpu_count": 2, "git_commit": "abc", "command": "x"}
    text = ddp.markdown(env, cases, plan, "test")
    assert "**error**: rank 1: AssertionError" in text and "**timeout**" in text and "**losses FAIL**" in text


def test_kernel_variants_relaunch_kilns_kernel_as_generated_and_rewritten():
    """benchmarks/gpu_kernel_variants.py on the CPU (Triton's interpreter): kiln's one kernel of softmax and of
    layer_norm, relaunched as generated, rewritten and with another launch config, computes eager's values."""
    import torch

    import kiln
    from benchmarks import gpu_kernel_variants as variants
    from benchmarks.workloads import layer_norm, softmax_last

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 256, generator=generator).to(torch.bfloat16)
    weight, bias = (torch.randn(256, generator=generator).to(torch.bfloat16) for _ in range(2))
    with kiln.config.patch(cpu_backend="triton"):
        known = {"div.full (a / b)", "ex2.approx exp (tl.exp)", "both", "x / 2^k as x * 2^-k",
                 "mean without its correction"}
        for fn, args, expected in [(softmax_last, (x,), "ex2.approx exp (tl.exp)"),
                                   (layer_norm, (x, weight, bias), "mean without its correction")]:
            kernel = variants.Kernel(fn, args)
            rewrites = variants._rewrites(kernel.source.source)
            assert expected in rewrites and set(rewrites) <= known  # which apply depends on the kernel's source
            eager = fn(*args)
            for text, xblock in [(None, None), *((text, None) for text in rewrites.values()), (None, 2)]:
                result = kernel.launcher(text, xblock)()
                torch.testing.assert_close(result, eager, atol=2e-2, rtol=2e-2)


def test_sass_census_counts_every_distinct_kernel_of_a_model():
    """benchmarks/sass_census.py on a small norm-and-projections block: each distinct CUDA kernel compiled for sm_90
    and counted, with the launches it stands for; the launches skipped for the trace are restored after it."""
    pytest.importorskip("triton")
    import torch

    from benchmarks import sass_census
    from kiln import _triton

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.q, self.k = torch.nn.LayerNorm(64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

        def forward(self, x):
            h = self.norm(x)
            return (torch.nn.functional.gelu(self.q(h)) * self.k(h),)

    run = _triton.SerializedInterpretedFunction.run
    rows = sass_census.census(Block, (torch.randn(4, 64),), {})
    assert _triton.SerializedInterpretedFunction.run is run
    assert rows and all(row["instructions"] > 0 and row["per_element"] > 0 and row["launches"] >= 1 for row in rows)
    assert len({row["kernel"] for row in rows}) == len(rows)


def test_sass_census_of_a_training_step_counts_the_backwards_kernels_too():
    """sass_census --train: the forward's and the backward's kernels (kiln.compile's graphs, recorded as they
    compile), each compiled for sm_90; the recording hook is removed after it."""
    pytest.importorskip("triton")
    import torch

    from benchmarks import sass_census
    from kiln import backend

    def block():
        return torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 64), torch.nn.GELU())

    compile_aten_graph = backend._compile_aten_graph
    inference = sass_census.census(block, (torch.randn(4, 64),), {})
    training = sass_census.census(block, (torch.randn(4, 64),), {}, train=True)
    assert backend._compile_aten_graph is compile_aten_graph
    assert len(training) > len(inference) and not any("error" in row for row in training)
    assert all(row["instructions"] > 0 for row in training)


def test_warm_start_diffs_a_key_the_warm_process_made_against_the_cold_ones(tmp_path):
    from benchmarks import warm_start

    keys = tmp_path / "kiln" / "keys" / "ab"
    keys.mkdir(parents=True)
    (keys / "kab1.txt").write_text("level torch\ninput 0 T((4,), (1,))\nnode a\nnode b")
    cold = warm_start._key_texts(str(tmp_path))
    (keys / "kab2.txt").write_text("level torch\ninput 0 T((4,), (1,))\nnode a\nnode c")
    diffs = warm_start._key_diffs(cold, warm_start._key_texts(str(tmp_path)))
    assert len(diffs) == 1 and "-node b" in diffs[0] and "+node c" in diffs[0] and "node a" not in diffs[0]
    assert warm_start._key_diffs(cold, cold) == []
