"""Compile worker processes: Triton compiles a graph's CUDA kernels in parallel, past the GIL.

compile_ahead (kiln/runtime/launch.py) has Triton compile a graph's kernels on a thread pool, and part of
Triton's compile holds the GIL (its front end, the kernel's AST to TTIR, is Python): on this project's
2-core CPU machine two threads compiled 13 of BERT's kernels 1.45x faster than one, and two heavy
kernels 1.69x faster (LLVM's passes and ptxas release it). Measured on an H100 at 0bb45f2, BERT-base's
cold first call was 9.45 s with the workers and 9.53 s without: no gain there. With
`config.compile_processes` (on by default) each of those threads first hands its kernel to a worker
process (kiln/runtime/compile_worker_main.py: the standard library and Triton, no torch), which writes
the compiled kernel into Triton's on-disk cache under the key the thread's own compile computes; the
thread's compile is then a cache hit that loads the files. A worker that fails, dies or runs past
`TIMEOUT_S` costs nothing but the wait: the thread compiles the kernel itself, as without workers.

The workers (`config.compile_workers`, by default one per CPU core) start when the first graph with
CUDA inputs begins to compile (`prestart`), so their start-up overlaps kiln's own tracing and
lowering, and they live until the process exits. With `config.compile_worker_warm_up` (off until a GPU has
measured it) each first compiles a throwaway kernel for the current GPU (compile_worker_main.py `warm_up`): a
process's first Triton compile costs 0.35-0.4 s more than a later one, which the worker pays then rather than on
the graph's kernel; such workers run at a lower priority than the parent (compile_worker_main.NICENESS), so that
the parent's tracing comes first on a busy host. A kernel already in Triton's cache is sent to no worker
(kiln/_triton.py `in_cache`): a warm start, whose graphs load from kiln's cache without tracing, starts none.
"""
from __future__ import annotations

import atexit
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
import time

TIMEOUT_S = 300.0
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_worker_main.py")


class _Worker:
    def __init__(self, warm_up_target: str | None = None):
        environment = dict(os.environ, TRITON_INTERPRET="0")
        if warm_up_target:  # the worker compiles a throwaway kernel for this GPU first (compile_worker_main.warm_up)
            environment["KILN_WARM_UP_TARGET"] = warm_up_target
        self.process = subprocess.Popen([sys.executable, "-P", _WORKER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=environment)

    def run(self, job: dict, timeout: float) -> tuple[bool, str]:
        data = pickle.dumps(job)
        self.process.stdin.write(struct.pack("<Q", len(data)) + data)
        self.process.stdin.flush()
        header = self._read(8, timeout)
        return pickle.loads(self._read(struct.unpack("<Q", header)[0], timeout))

    def _read(self, count: int, timeout: float) -> bytes:
        deadline, chunks, fd = time.monotonic() + timeout, [], self.process.stdout.fileno()
        while count:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError(f"no reply from the compile worker in {timeout:.0f} s")
            chunk = os.read(fd, count)
            if not chunk:
                raise EOFError(f"the compile worker exited (code {self.process.poll()})")
            chunks.append(chunk)
            count -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        try:
            self.process.stdin.close()  # the worker's read ends: it exits
            self.process.wait(timeout=5)
        except Exception:
            self.process.kill()


class CompileWorkers:
    """`count` worker processes, each compiling one kernel at a time for whichever thread takes it."""

    def __init__(self, count: int):
        self.count = max(1, count)
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self.failures: list[str] = []  # what the workers reported (the threads compiled those kernels themselves)
        self.warm_up_target: str | None = None  # the GPU the workers warm up for ("": none), read at the first start

    def start(self) -> None:
        with self._lock:
            if len(self._all) < self.count and self.warm_up_target is None:
                from kiln.config import config

                self.warm_up_target = (_current_target() or "") if config.compile_worker_warm_up else ""
            while len(self._all) < self.count:
                worker = _Worker(self.warm_up_target)
                self._all.append(worker)
                self._idle.put(worker)

    def compile(self, job: dict, timeout: float = TIMEOUT_S) -> bool:
        """Compile `job` (kiln/_triton.py compile_job) in a worker; whether it succeeded. The job carries the
        parent's Triton key, so that no worker hashes Triton's files again."""
        job = dict(job, triton_key=triton_key())
        self.start()
        worker = self._idle.get()
        try:
            ok, message = worker.run(job, timeout)
        except Exception as error:  # a dead or stuck worker is replaced
            worker.process.kill()
            with self._lock:
                self._all.remove(worker)
            self.failures.append(f"{type(error).__name__}: {error}")
            return False
        self._idle.put(worker)
        if not ok:
            self.failures.append(message)
        return ok

    def close(self) -> None:
        with self._lock:
            workers, self._all = self._all, []
        for worker in workers:
            worker.close()


_workers: CompileWorkers | None = None
_workers_lock = threading.Lock()


def workers() -> CompileWorkers | None:
    """The process's compile workers (created, not started, on first use), or None when
    `config.compile_processes` is off or Triton interprets kernels."""
    global _workers
    from kiln.config import config

    if not config.compile_processes or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return None
    with _workers_lock:
        if _workers is None:
            _workers = CompileWorkers(config.compile_workers or os.cpu_count() or 1)
            atexit.register(_workers.close)
        return _workers


def _current_target() -> str | None:
    """The current GPU as Triton's target, "cuda,<arch>,<warp size>", or None where there is none to ask."""
    try:
        from triton.runtime import driver

        target = driver.active.get_current_target()
        return f"{target.backend},{target.arch},{target.warp_size}"
    except Exception:
        return None


_triton_key_lock = threading.Lock()
_triton_key_thread: threading.Thread | None = None
_triton_key: str | None = None  # Triton's cache-key prefix once known: set by `remember_triton_key`'s thread


def remember_triton_key() -> None:
    """Start, once per process and on a thread of its own, giving Triton its cache-key prefix from kiln's cache
    (kiln/_triton.py `triton_key_stamp`), computing and storing it where Triton's files changed since it was
    stored. The thread runs while the graph is traced and lowered: the hashing (0.3 s of a cold first call on
    the GPU machine's main thread, 2026-12-06) releases the GIL. `triton_key()` waits for it. A failure leaves
    Triton to compute its key itself, as without kiln."""
    global _triton_key_thread
    with _triton_key_lock:
        if _triton_key_thread is not None or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            return
        _triton_key_thread = threading.Thread(target=_remember_triton_key, name="kiln-triton-key", daemon=True)
        _triton_key_thread.start()


def _remember_triton_key() -> None:
    global _triton_key
    try:
        from kiln import _triton
        from kiln.runtime import cache

        stamp = _triton.triton_key_stamp()
        relative = cache.entry_name("triton-key", cache.source_hash(stamp), ".json")
        record = cache.load_record(relative, stamp, {"triton_key": str})
        if record is None:
            record = {"triton_key": _triton.computed_triton_key()}
            cache.store_record(relative, stamp, record)
        _triton.use_triton_key(record["triton_key"])
        _triton_key = record["triton_key"]
    except Exception as error:
        from kiln.runtime.cache import warn_once

        warn_once("triton-key", "kiln: Triton's cache key could not be remembered (%s: %s); Triton computes it",
                  type(error).__name__, error)


def triton_key() -> str | None:
    """Triton's cache-key prefix (started by `remember_triton_key`, waited for here), or None where it is not
    known: interpreted kernels, or a failure (Triton then computes it in each process that compiles)."""
    remember_triton_key()
    thread = _triton_key_thread
    if thread is not None:
        thread.join()
    return _triton_key


def prestart() -> None:
    """Start the workers now (in the background: start-up overlaps the caller's work)."""
    remember_triton_key()
    pool = workers()
    if pool is not None:
        try:
            pool.start()
        except OSError:  # no processes to be had: the threads compile as before
            pass
