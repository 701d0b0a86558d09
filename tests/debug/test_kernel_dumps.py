"""KILN_DEBUG kernel files (kiln/debug/dump.py): a dumped Triton kernel runs on its own, as
`python kernel_k0.py` (here on the CPU under Triton's interpreter); a C++ one says what builds it."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

import kiln

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def softmax_plus(x, w):
    return torch.softmax(x * w, dim=-1) + torch.tanh(x)


def compile_with_dumps(debug_dir, cpu_backend):
    with kiln.config.patch(debug=True, debug_dir=str(debug_dir), cpu_backend=cpu_backend, strict=True):
        kiln.compile(softmax_plus)(torch.randn(6, 40), torch.randn(40))
    return sorted(debug_dir.rglob("kernel_*"))


def run_script(path, **env):
    environment = {key: value for key, value in os.environ.items() if not key.startswith("KILN_")}
    environment.update(PYTHONPATH=REPO_ROOT, **env)
    return subprocess.run([sys.executable, str(path)], cwd=path.parent, env=environment, capture_output=True,
                          text=True, timeout=300)


def test_a_dumped_triton_kernel_runs_on_its_own(tmp_path):
    kernels = compile_with_dumps(tmp_path / "debug", "triton")
    assert kernels and all(path.suffix == ".py" for path in kernels)
    text = kernels[0].read_text()
    assert "@triton.jit\ndef kernel_" in text and "def make_inputs(device)" in text and '__name__ == "__main__"' in text
    assert "triton.testing.do_bench" in text  # how it is timed on a GPU
    result = run_script(kernels[0], TRITON_INTERPRET="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"kernel {kernels[0].stem[len('kernel_'):]}: ran once under Triton's interpreter" in result.stdout


def test_a_dumped_triton_kernel_says_what_it_needs_without_a_gpu_or_the_interpreter(tmp_path):
    kernels = compile_with_dumps(tmp_path / "debug", "triton")
    if torch.cuda.is_available():
        return  # there it runs: the other test's case
    result = run_script(kernels[0], TRITON_INTERPRET="0")
    assert result.returncode != 0 and "TRITON_INTERPRET=1 python" in result.stderr


def test_a_dumped_cpp_kernel_says_what_compiles_it(tmp_path):
    kernels = compile_with_dumps(tmp_path / "debug", "cpp")
    assert kernels and all(path.suffix == ".cpp" for path in kernels)
    text = kernels[0].read_text()
    assert text.startswith("// Built by kiln/runtime/cpp_build.py") and "-O3" in text and "extern \"C\"" in text


def test_an_observer_sees_every_stage_of_a_graph_the_whole_graph_cache_holds(tmp_path, monkeypatch):
    """A warm start (the plain-inference link, kiln/aot/plain.py) skips the stages. The HTML report's observer
    (whose option is not part of the cache key) bypasses it, so what it shows is as complete as on a cold
    start; before, a second run of a script showed graphs with 0 kernels and only a `load` stage."""
    from kiln.debug.dump import GraphDump

    def fn(x):
        return torch.sin(x) * 2 + 1

    x = torch.randn(64)
    seen = []

    def observe(dump, gm):
        dump.kept = {}
        seen.append(dump)

    with kiln.config.patch(cache_dir=str(tmp_path / "cache"), graph_cache=True), torch.no_grad():
        kiln.compile(fn)(x)  # fills the cache and links the graph
        kiln.reset()
        monkeypatch.setattr(GraphDump, "observer", observe)
        kiln.compile(fn)(x)
    assert any("loopir_after_fusion.txt" in dump.kept for dump in seen), [sorted(d.kept) for d in seen]
