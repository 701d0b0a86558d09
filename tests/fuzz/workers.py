"""Worker processes for fuzz runs, so that no program can take the run down.

Each worker is a `spawn`ed process that imports torch and kiln once and runs the
programs it is sent, one at a time, each under an in-worker alarm (tests/fuzz/runner.py).
The parent gives every program a deadline past that alarm: a worker that dies (segfault,
abort, out of memory) or stays silent (a hang in C code) is killed and replaced, and the
program it was running is recorded as a crash or a timeout. Workers are recycled every
`PROGRAMS_PER_WORKER` programs so that leaks stay bounded.

The environment decides the Triton mode before triton is imported: the parent sets
TRITON_INTERPRET (1 for CPU tensors, 0 for CUDA) and the spawned workers inherit it.
"""
from __future__ import annotations

import collections
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Callable

from tests.fuzz.runner import Outcome, ProgramResult
from tests.worker_process import WorkerProcess, redirect_output

STARTUP_SECONDS = 300.0   # importing torch and kiln on a loaded machine
GRACE_SECONDS = 30.0      # past the in-worker alarm before the parent kills the worker
PROGRAMS_PER_WORKER = 200


@dataclass(frozen=True)
class Task:
    """One program to run on one backend."""

    program: object  # tests.fuzz.program.Program
    backend: str = "cpp"
    device: str = "cpu"


def set_triton_mode(device: str) -> None:
    """TRITON_INTERPRET for `device`, before anything imports triton (the CLI calls it first)."""
    os.environ["TRITON_INTERPRET"] = "1" if device == "cpu" else "0"


def worker_main(connection, timeout: float | None, threads: int, log_path: str | None) -> None:
    """Run the tasks received on `connection` until told to stop (a None task)."""
    import faulthandler
    import logging
    import warnings

    redirect_output(log_path)
    faulthandler.enable()
    import torch

    import kiln  # noqa: F401
    from tests.fuzz.runner import run_program

    torch.set_num_threads(threads)
    logging.getLogger("kiln").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    connection.send(("ready", None))
    while True:
        task = connection.recv()
        if task is None:
            return
        connection.send(("result", run_program(task.program, backend=task.backend, device=task.device,
                                               timeout=timeout)))


class _Worker(WorkerProcess):
    """A fuzz worker: the program it runs now (`task_id`) and how many it has run."""

    def __init__(self, context, worker_args: tuple) -> None:
        super().__init__(context, worker_main, worker_args, STARTUP_SECONDS)
        self.task_id: int | None = None
        self.done = 0


def run_pool(tasks: list[Task], *, jobs: int = 1, timeout: float | None = 60.0, log_path: str | None = None,
             on_result: Callable[[int, ProgramResult], None] | None = None,
             budget: float | None = None) -> list[ProgramResult]:
    """Run the tasks in `jobs` worker processes; one result per task run, in order.

    With `budget` (seconds), no task starts once it is spent: the tasks already running
    finish and the rest are left out, so a run fits a machine's time limit."""
    context = multiprocessing.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))
    worker_args = (timeout, threads, log_path)
    hard_timeout = (timeout or 600.0) + GRACE_SECONDS
    results: dict[int, ProgramResult] = {}
    pending = collections.deque(range(len(tasks)))
    workers: list[_Worker] = []
    stop_at = None if budget is None else time.monotonic() + budget

    def record(task_id: int, result: ProgramResult) -> None:
        results[task_id] = result
        if on_result is not None:
            on_result(task_id, result)

    def lost(worker: _Worker, outcome: str, reason: str) -> None:
        workers.remove(worker)
        if worker.task_id is None:
            if not worker.ready:
                raise RuntimeError(f"fuzz worker could not start: {reason}")
            return
        program = tasks[worker.task_id].program
        record(worker.task_id, ProgramResult(program.name, program.seed, program.index, outcome, reason))

    try:
        while pending or any(worker.task_id is not None for worker in workers):
            if stop_at is not None and pending and time.monotonic() > stop_at:
                print(f"fuzz run: time budget of {budget:.0f} s spent: {len(pending)} programs not run",
                      file=sys.stderr, flush=True)
                pending.clear()
                continue
            while len(workers) < min(jobs, len(pending) + sum(w.task_id is not None for w in workers)):
                workers.append(_Worker(context, worker_args))
            for worker in workers:
                if worker.ready and worker.task_id is None and pending:
                    worker.task_id = pending.popleft()
                    worker.deadline = time.monotonic() + hard_timeout
                    worker.connection.send(tasks[worker.task_id])
            next_deadline = min(worker.deadline for worker in workers)
            for connection in wait([worker.connection for worker in workers],
                                   timeout=max(0.05, next_deadline - time.monotonic())):
                worker = next(worker for worker in workers if worker.connection is connection)
                try:
                    kind, payload = connection.recv()
                except (EOFError, OSError):
                    lost(worker, Outcome.CRASH, worker.death_reason())
                    continue
                if kind == "ready":
                    worker.ready = True
                elif kind == "result":
                    record(worker.task_id, payload)
                    worker.task_id, worker.done = None, worker.done + 1
                    if worker.done >= PROGRAMS_PER_WORKER or not pending:
                        workers.remove(worker)
                        worker.stop()
            now = time.monotonic()
            for worker in [worker for worker in workers if worker.deadline < now]:
                silent = hard_timeout if worker.ready else STARTUP_SECONDS
                worker.kill()
                lost(worker, Outcome.TIMEOUT, f"worker silent for {silent:.0f} s, killed")
    except KeyboardInterrupt:
        print("fuzz run interrupted: reporting what finished", file=sys.stderr)
    finally:
        for worker in workers:
            if worker.task_id is None and worker.process.is_alive():
                worker.stop()
            else:
                worker.kill()
    return [results[task_id] for task_id in sorted(results)]


class WorkerSession:
    """One worker kept alive across tasks that are chosen one after another (the minimizer).

    `run(task)` returns the task's result; a worker that dies or hangs is replaced and
    the task recorded as a crash or a timeout, as in `run_pool`.
    """

    def __init__(self, *, timeout: float | None = 60.0, log_path: str | None = None) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._args = (timeout, max(1, os.cpu_count() or 1), log_path)
        self._hard_timeout = (timeout or 600.0) + GRACE_SECONDS
        self._worker: _Worker | None = None

    def __enter__(self) -> "WorkerSession":
        return self

    def __exit__(self, *exc) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def _ready_worker(self) -> _Worker:
        if self._worker is None:
            self._worker = _Worker(self._context, self._args)
        worker = self._worker
        while not worker.ready:
            if not worker.connection.poll(max(0.0, worker.deadline - time.monotonic())):
                worker.kill()
                self._worker = None
                raise RuntimeError("fuzz worker did not start")
            kind, _ = worker.connection.recv()
            worker.ready = kind == "ready"
        return worker

    def run(self, task: Task) -> ProgramResult:
        worker = self._ready_worker()
        program = task.program
        worker.connection.send(task)
        try:
            if worker.connection.poll(self._hard_timeout):
                kind, payload = worker.connection.recv()
                return payload
            worker.kill()
            self._worker = None
            return ProgramResult(program.name, program.seed, program.index, Outcome.TIMEOUT,
                                 f"worker silent for {self._hard_timeout:.0f} s, killed")
        except (EOFError, OSError):
            reason = worker.death_reason()
            self._worker = None
            return ProgramResult(program.name, program.seed, program.index, Outcome.CRASH, reason)
