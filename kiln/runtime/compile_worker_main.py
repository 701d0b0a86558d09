"""A compile worker process: Triton compiles sent to it, one at a time, into Triton's on-disk cache.

Run by kiln/runtime/compile_workers.py as `python -P <this file>`, not imported: it needs only the
standard library and Triton (a kernel's source imports nothing else), so it starts in well under a
second and never imports torch or kiln, nor re-runs the user's main script (as multiprocessing's
spawn would).

Protocol, over the process's stdin and stdout: each request and each reply is an 8-byte
little-endian length and that many bytes of pickle. A request is a dict (kiln/_triton.py
`compile_job`): the kernel's module text and path, its module and function names, and the ASTSource's
signature, constants and attributes, with the target, options and environment of the compile that
Triton's JIT would run. The reply is `(ok, message)`. The compile writes the kernel into Triton's cache
under the key the JIT's own compile computes, so that compile, in the parent, is a cache hit.
"""
import functools
import linecache
import os
import pickle
import struct
import sys
import types


def _compile(job: dict, build_launcher: bool = True) -> None:
    import threading

    import triton
    from triton.compiler import ASTSource
    from triton.runtime import cache

    if job.get("triton_key") and not getattr(cache.triton_key, "kiln_parents", False):
        # The parent's Triton cache-key prefix (kiln/runtime/compile_workers.py): this process need not hash
        # Triton's files (0.36 s) to find the cache folder of the kernel it writes. Without it Triton computes it.
        known = job["triton_key"]
        cache.triton_key = functools.lru_cache(maxsize=None)(lambda: known)
        cache.triton_key.kiln_parents = True

    linecache.cache[job["path"]] = (len(job["text"]), None, job["text"].splitlines(True), job["path"])
    module = types.ModuleType(job["module"])
    module.__dict__["__file__"] = job["path"]
    exec(compile(job["text"], job["path"], "exec"), module.__dict__)
    function = triton.jit(getattr(module, job["function"]))
    source = ASTSource(function, job["signature"], constexprs=job["constants"], attrs=job["attrs"])
    if not build_launcher:
        triton.compile(source, target=job["target"], options=job["options"], _env_vars=job["env_vars"])
        return
    launcher = threading.Thread(target=_build_launcher, args=(source, job["target"]))
    launcher.start()
    try:
        triton.compile(source, target=job["target"], options=job["options"], _env_vars=job["env_vars"])
    finally:
        launcher.join()


def _build_launcher(source, target) -> None:
    """Build the kernel's launcher into Triton's cache while the kernel compiles: the C source of a CUDA
    launcher depends only on the kernel's signature and constants, and compiling it runs a C compiler
    (0.26 s on an H100 host) that the parent's thread would otherwise run after the compile, when it loads
    the kernel. `CudaLauncher` builds (or finds) the module first, then reads the compiled kernel's
    metadata, which this stand-in lacks: the error that follows is expected. Anything else that fails
    (no CUDA driver library, another Triton) leaves the build to the parent, as before."""
    if getattr(target, "backend", None) != "cuda":
        return
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(source, types.SimpleNamespace())
    except Exception:
        pass


_WARM_UP_SOURCE = """
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice


def kiln_warm_up(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + row * n + offsets, mask=mask, other=0.0).to(tl.float32)
    y = libdevice.exp(x - tl.max(x, 0))
    tl.store(out_ptr + row * n + offsets, (y / tl.sum(y, 0)).to(tl.bfloat16), mask=mask)
"""


def warm_up(description: str) -> None:
    """Compile a small row kernel for the parent's GPU (`description`: "cuda,<arch>,<warp size>", the parent's
    KILN_WARM_UP_TARGET) and throw it away: a process's first Triton compile pays for importing the compiler,
    making its MLIR context and loading libdevice (0.4 s more than a later compile on this project's CPU
    machine, 2026-12-06), which the worker then pays while the parent traces, not on its first kernel. The
    compile bypasses Triton's cache (`always_compile`), under a key prefix of its own (no hash of Triton's
    files); its result is not kept. Only CUDA targets; a failure is ignored (the first job pays as before)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime import cache

    backend, arch, warp_size = description.split(",")
    if backend != "cuda":
        return
    key_function, always_compile = cache.triton_key, knobs.compilation.always_compile
    cache.triton_key = lambda: "kiln-warm-up"
    knobs.compilation.always_compile = True
    try:
        _compile({"path": "<kiln warm-up>", "text": _WARM_UP_SOURCE, "module": "kiln_warm_up",
                  "function": "kiln_warm_up", "signature": {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32",
                                                            "BLOCK": "constexpr"},
                  "constants": {"BLOCK": 1024}, "attrs": {}, "target": GPUTarget(backend, int(arch), int(warp_size)),
                  "options": {"num_warps": 4}, "env_vars": {}}, build_launcher=False)
    except Exception:
        pass
    finally:
        cache.triton_key, knobs.compilation.always_compile = key_function, always_compile


NICENESS = 5  # added to the worker's scheduling niceness


def main() -> None:
    if os.environ.get("KILN_WARM_UP_TARGET"):  # config.compile_worker_warm_up
        try:  # the parent's tracing is the first call's critical path while the workers start and warm up: on a
            os.nice(NICENESS)  # busy host (16 workers on 16 cores) the workers yield the CPU to it, and use what is idle
        except OSError:
            pass
        warm_up(os.environ["KILN_WARM_UP_TARGET"])
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed while compiling (Triton, ptxas) goes to stderr, not into the replies
    while True:
        header = requests.read(8)
        if len(header) < 8:
            return  # the parent closed the pipe
        job = pickle.loads(requests.read(struct.unpack("<Q", header)[0]))
        try:
            _compile(job)
            reply = (True, "")
        except BaseException as error:  # reported to the parent, which compiles the kernel itself
            reply = (False, f"{type(error).__name__}: {error}")
        data = pickle.dumps(reply)
        replies.write(struct.pack("<Q", len(data)) + data)
        replies.flush()


if __name__ == "__main__":
    main()
