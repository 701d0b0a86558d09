"""Building and loading the C++ kernels of kiln/codegen/cpp.py.

What it owns:
- the toolchain: which C++ compiler exists, whether it has OpenMP and glibc's vector
  math library (libmvec), and the flags that follow (`-O3 -march=native -fopenmp ...`).
  Detected once per compiler binary and host CPU, and remembered on disk beside the
  kernels in a record that holds its own key (kiln/runtime/cache.py): a record of another
  compiler or host, or one without its fields, is detected again, never trusted;
  without OpenMP kernels run on one thread (`-fopenmp-simd` still vectorizes), and
  without a compiler `CppCompileError` says so, which makes the graph run eagerly;
- the on-disk cache of shared libraries: one per kernel source, named by the hash of its
  key (the source, the compiler's identity and version, the flags, the host CPU that
  `-march=native` resolves to) and sealed with that key's hash and its own
  (`cache.seal`). A library is checked against its key before `dlopen` ever sees it, so
  a swapped, truncated or corrupt one is rebuilt, never loaded;
- compiling a graph's kernels in parallel (a thread pool: each build is a compiler
  process) and loading each library once per process with ctypes, its argument types
  set at load so a call converts plain ints quickly.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kiln.config import config
from kiln.runtime.progress import Progress
from kiln.runtime import cache
from kiln.runtime.cache import source_hash

KERNEL_SYMBOL = "kiln_kernel"  # the extern "C" entry point of every generated library
LIBRARY_FORMAT = "kiln-cpp-library-2"  # part of every library's key: bump it when a library's layout changes
COMPILER_CANDIDATES = ("g++", "c++", "clang++")
# -ffp-contract=off: without it g++ fuses a * b + c into an fma wherever it inlines, differently in
# each loop, so one pointwise value recomputed by two passes of a reduction (the mean pass and the
# squares pass of a var) differs by an ulp and var of equal values is not 0 (fuzz seed 101 #2148);
# the fmas kiln wants are written as std::fma.
BASE_FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-std=c++17", "-fno-math-errno", "-fwrapv",
              "-ffp-contract=off", "-Wno-unknown-pragmas")


class CppCompileError(RuntimeError):
    """No usable C++ compiler, or a generated kernel that did not compile."""


@dataclass(frozen=True)
class Toolchain:
    """A compiler and what it can do; `flags` is everything passed besides files."""

    compiler: str
    version: str
    openmp: bool
    vector_math: bool  # glibc's libmvec: vectorized sinf, expf, erff... (the kernel prelude declares them)
    flags: tuple
    host: str = ""  # the host CPU's fingerprint: what `-march=native` compiles for

    @property
    def identity(self) -> str:
        """What a cached library depends on besides its source."""
        return f"{LIBRARY_FORMAT}|{self.compiler}|{self.version}|{' '.join(self.flags)}|{self.host}"


def _find_compiler() -> str:
    if config.cpp_compiler:
        found = shutil.which(config.cpp_compiler)
        if found is None:
            raise CppCompileError(f"KILN_CPP_COMPILER={config.cpp_compiler!r} is not an executable on PATH")
        return found
    for name in COMPILER_CANDIDATES:
        found = shutil.which(name)
        if found is not None:
            return found
    raise CppCompileError(f"no C++ compiler found (looked for {', '.join(COMPILER_CANDIDATES)} on PATH): "
                          "install g++ or set KILN_CPP_COMPILER, or use KILN_CPU_BACKEND=triton")


_PROBE_PLAIN = "extern \"C\" int probe() { return 0; }\n"
_PROBE_OPENMP = "#include <omp.h>\nextern \"C\" int probe() { return omp_get_max_threads(); }\n"
_PROBE_VECTOR_MATH = ("extern \"C\" {\n#pragma omp declare simd notinbranch\nfloat erfcf(float);\n}\n"
                      "extern \"C\" void probe(float* x, long n) {\n#pragma omp simd\n"
                      "for (long i = 0; i < n; i++) x[i] = erfcf(x[i]);\n}\n")


def _compiles(compiler: str, source: str, flags: list) -> bool:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "probe.cpp")
        with open(path, "w") as handle:
            handle.write(source)
        result = subprocess.run([compiler, *flags, path, "-o", os.path.join(folder, "probe.so")],
                                capture_output=True, text=True)
        return result.returncode == 0


# g++ 12 on a CPU with AVX512-FP16 (Sapphire Rapids) emits a masked `vmovsh` that binutils 2.40 rejects
# ("unsupported masking for `vmovsh'"), so a kernel with fp16 stores failed to build and its graph ran
# eagerly (fuzz seed 3007 #5530). kiln does fp16 math in float and needs no FP16 instructions; where the
# compiler takes the flag (x86), they are turned off.
NO_FP16_INSTRUCTIONS = "-mno-avx512fp16"


def _detect(compiler: str) -> dict:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    openmp = _compiles(compiler, _PROBE_OPENMP, [*BASE_FLAGS, "-fopenmp"])
    simd_flag = "-fopenmp" if openmp else "-fopenmp-simd"
    vector_math = _compiles(compiler, _PROBE_VECTOR_MATH, [*BASE_FLAGS, simd_flag, "-lmvec"])
    no_fp16 = _compiles(compiler, _PROBE_PLAIN, [*BASE_FLAGS, simd_flag, NO_FP16_INSTRUCTIONS])
    return {"version": version, "openmp": openmp, "vector_math": vector_math, "no_fp16": no_fp16}


@functools.lru_cache(maxsize=None)
def host_cpu() -> str:
    """A fingerprint of this machine's CPU (model and feature flags): `-march=native` builds for it,
    so a cache dir shared by several machines must not hand one's libraries to another."""
    try:
        with open("/proc/cpuinfo") as handle:
            first = handle.read().split("\n\n")[0]
        wanted = ("vendor_id", "cpu family", "model", "model name", "flags", "Features", "CPU part")
        lines = [line for line in first.splitlines() if line.split(":")[0].strip() in wanted]
        return source_hash("\n".join(lines))[:16]
    except OSError:
        return source_hash(f"{platform.machine()}|{platform.processor()}")[:16]


_TOOLCHAIN_FIELDS = {"version": str, "openmp": bool, "vector_math": bool, "no_fp16": bool}


@functools.lru_cache(maxsize=None)
def _toolchain_for(compiler: str, use_openmp: bool) -> Toolchain:
    stat = os.stat(compiler)
    key = f"{compiler}|{stat.st_size}|{stat.st_mtime_ns}|{' '.join(BASE_FLAGS)}|{host_cpu()}"
    record_name = os.path.join("cpp", f"toolchain-{source_hash(key)[:24]}.json")
    found = cache.load_record(record_name, key, _TOOLCHAIN_FIELDS)
    if found is None:
        found = _detect(compiler)
        cache.store_record(record_name, key, found)
    openmp = found["openmp"] and use_openmp
    flags = [*BASE_FLAGS, "-fopenmp" if openmp else "-fopenmp-simd"]
    if found["no_fp16"]:
        flags.append(NO_FP16_INSTRUCTIONS)
    if found["vector_math"]:
        flags += ["-DKILN_VECTOR_MATH", "-lmvec"]
    return Toolchain(compiler, found["version"], openmp, found["vector_math"], tuple(flags), host_cpu())


def toolchain() -> Toolchain:
    """The compiler kernels are built with (raises CppCompileError when there is none)."""
    return _toolchain_for(_find_compiler(), bool(config.cpp_openmp))


def library_key(source: str, tools: Toolchain) -> str:
    """The hash of everything a library is built from: the name of its cache entry and its seal."""
    return source_hash(tools.identity + "\n" + source)


def library_path(source: str, tools: Toolchain) -> str:
    """Where the library for `source` is cached (in the cache dir; see `build_library`)."""
    return os.path.join(config.cache_dir, _library_name(library_key(source, tools)))


def _library_name(key: str) -> str:
    return cache.entry_name("cpp", key, ".so")


def cached_library(source: str, tools: Toolchain) -> str | None:
    """The path of a cached library for `source` that is whole and was built from it, else None.
    Checked by reading the file, before anything loads it."""
    key = library_key(source, tools)
    return cache.lookup(_library_name(key), lambda path: cache.check_sealed(path, key))


def build_library(source: str, tools: Toolchain) -> str:
    """Path of the shared library for `source`, compiled now unless a valid one is cached."""
    found = cached_library(source, tools)
    if found is not None:
        return found
    key = library_key(source, tools)
    with tempfile.TemporaryDirectory(prefix="kiln-cpp-") as scratch:
        source_file = os.path.join(scratch, "kernel.cpp")
        with open(source_file, "w") as handle:
            handle.write(source)
        output = os.path.join(scratch, "kernel.so")
        # -l flags must follow the source file for the linker to use them.
        libraries = [flag for flag in tools.flags if flag.startswith("-l")]
        options = [flag for flag in tools.flags if not flag.startswith("-l")]
        result = subprocess.run([tools.compiler, *options, source_file, "-o", output, *libraries],
                                capture_output=True, text=True)
        if result.returncode != 0:
            kept = cache.store(os.path.join("cpp", key[:2], f"failed-{key[:16]}.cpp"), source.encode())
            raise CppCompileError(f"{tools.compiler} could not compile a kiln kernel (source kept at {kept}):\n"
                                  + result.stderr[-4000:])
        with open(output, "rb") as handle:
            library = handle.read()
    path = cache.store(_library_name(key), cache.seal(library, key))
    _remove_legacy_digest(path)
    return path


def _remove_legacy_digest(path: str) -> None:
    """Kiln before LIBRARY_FORMAT 2 wrote a digest beside each library: it is no evidence of anything."""
    try:
        os.unlink(path + ".sha256")
    except OSError:
        pass


@dataclass(frozen=True)
class KernelSignature:
    """How a generated kernel is called: pointer and int64 parameters, an int result."""

    pointer_count: int
    size_count: int


_loaded: dict = {}  # library path -> ctypes function (a library is loaded once per process)


def load_function(path: str, signature: KernelSignature):
    """The kernel's entry point with its argument types set once, ready to call with ints."""
    if path not in _loaded:
        library = ctypes.CDLL(path)
        function = getattr(library, KERNEL_SYMBOL)
        function.argtypes = [ctypes.c_void_p] * signature.pointer_count + [ctypes.c_int64] * signature.size_count
        function.restype = ctypes.c_int
        _loaded[path] = function
    return _loaded[path]


def compile_kernels(kernels: list) -> dict:
    """Kernel name -> callable for a graph's C++ kernels (objects with .name, .source,
    .signature), compiled in parallel; identical sources are built once."""
    if not kernels:
        return {}
    tools = toolchain()
    unique = sorted({kernel.source for kernel in kernels})
    workers = max(1, min(len(unique), config.compile_workers or os.cpu_count() or 1))
    progress = Progress(len(unique), "building the C++ kernels of a graph")

    def build(text: str) -> str:
        path = build_library(text, tools)
        progress.step()
        return path

    if workers == 1:
        paths = dict(zip(unique, map(build, unique)))
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            paths = dict(zip(unique, pool.map(build, unique)))
    return {kernel.name: load_function(paths[kernel.source], kernel.signature) for kernel in kernels}
