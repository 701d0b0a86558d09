"""The product template's candidate tiles compiled for the H200 (sm_90) without a GPU: per tile, shared
memory, registers and spills (cuobjdump's resource usage of the cubin), whether it runs on tensor cores
(wgmma) and how deep its k loop is pipelined.

    python -m benchmarks.sm90_tiles [--out results.md]

A tile that spills registers or does not pipeline is a poor candidate before any timing; the GPU's
timings (benchmarks/gpu_template_check.py, KILN_LOGS=perf) decide among the rest.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import triton  # noqa: E402

import kiln  # noqa: E402
from kiln.codegen import triton_templates  # noqa: E402
from kiln.codegen.triton import generate_kernel  # noqa: E402
from tests.codegen.test_gpu_compile import compiled_for_h200, job_of, shared_buffers  # noqa: E402

F = torch.nn.functional
PROGRAM = lambda x, w, b: F.gelu(F.linear(x, w, b))  # noqa: E731


def template_source(dtype, tile):
    """BERT's FFN up-projection with bias and gelu (4096x768 @ 768x3072) as the template with `tile`."""
    from tests.backend.test_pipeline import compiled_graphs

    x, w, b = torch.randn(4096, 768, dtype=dtype), torch.randn(3072, 768, dtype=dtype), torch.randn(3072, dtype=dtype)
    captured = {}

    def stop(module_source, **kwargs):
        captured["scheduled"] = kwargs["scheduled"]
        raise RuntimeError("codegen only")

    import kiln.runtime.loader as loader
    original, loader.load_module = loader.load_module, stop
    try:
        with kiln.config.patch(cpu_backend="triton", matmul_template="on", graph_cache=False):
            try:
                compiled_graphs(PROGRAM, x, w, b)
            except Exception:
                pass
    finally:
        loader.load_module = original
    scheduled = captured["scheduled"]
    (kernel,) = [k for k in scheduled.kernels if k.template is not None]
    kernel.template.config = tile
    return generate_kernel(kernel, scheduled.graph, "cuda")


def resources(source) -> dict:
    compiled = compiled_for_h200(job_of(source))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(compiled.asm["cubin"])
        handle.flush()
        cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", handle.name], capture_output=True,
                               text=True).stdout
    registers = re.search(r"REG:(\d+)", usage)
    spills = re.search(r"STACK:(\d+)", usage)
    stages = {int(shape.split("x")[0]) for shape in shared_buffers(compiled)}
    return {"shared KiB": compiled.metadata.shared / 1024, "registers": int(registers.group(1)) if registers else None,
            "stack bytes": int(spills.group(1)) if spills else None, "wgmma": "wgmma" in compiled.asm["ptx"],
            "pipeline depth": max(stages) if stages else 1}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "kiln"], capture_output=True, text=True).stdout.strip()
    lines = [f"# Product template tiles compiled for sm_90 ({datetime.date.today()})", "",
             f"- kiln {os.environ.get('KILN_GIT_COMMIT', commit)}{'-dirty' if dirty else ''}",
             f"- triton {triton.__version__}, torch {torch.__version__}, compiled on a CPU (no GPU): ptxas from the "
             f"Triton wheel", "- kernel: gelu(x @ W.T + b), 4096x768 @ 768x3072 (BERT's FFN up-projection)",
             "- command: `python -m benchmarks.sm90_tiles`", "",
             "| dtype | tile | shared KiB | registers / thread | stack bytes (spills) | wgmma | k-loop buffers |",
             "|---|---|---|---|---|---|---|"]
    for dtype in (torch.bfloat16, torch.float32):
        for tile in triton_templates.candidates(dtype):
            row = resources(template_source(dtype, tile))
            lines.append(f"| {str(dtype)[6:]} | {tile} | {row['shared KiB']:.0f} | {row['registers']} | "
                         f"{row['stack bytes']} | {row['wgmma']} | {row['pipeline depth']} |")
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
