"""A pool of worker processes for the full sweep, so that no sample can take the sweep down.

Each worker (a `spawn`ed process that loads torch and the op database once) takes one
case at a time and streams back a message per sample: `start i` before it runs sample
i, then its result. The parent gives every message a deadline. A worker that dies
(segfault, abort, out of memory) or stays silent past the deadline (a hang in C code
that the in-worker alarm cannot interrupt) is killed and replaced; the sample it was
running is recorded as a crash or a timeout, and the rest of the case is queued again
from the next sample, so one bad sample costs only itself.
"""
from __future__ import annotations

import collections
import logging
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Callable

from tests.ops.harness import Case, Outcome, SampleResult
from tests.worker_process import WorkerProcess, redirect_output

STARTUP_SECONDS = 300.0    # importing torch and building op_db, on a loaded machine
GRACE_SECONDS = 60.0       # past the in-worker alarm before the parent kills the worker
CASES_PER_WORKER = 60      # recycle workers so leaks (compiled graphs, caches) stay bounded


@dataclass
class CaseRecord:
    """Everything the sweep learned about one case."""

    case: Case
    samples: list[SampleResult] = field(default_factory=list)
    error: str | None = None   # the case could not start (sample generation failed or crashed)
    finished: bool = False


@dataclass(frozen=True)
class Task:
    case: Case
    first_sample: int = 0


def worker_main(connection, backend: str, max_samples: int | None, timeout: float | None,
                log_path: str | None) -> None:
    """Run tasks received on `connection` until told to stop (a None task)."""
    import faulthandler
    import warnings

    from tests.ops import harness

    redirect_output(log_path)
    faulthandler.enable()

    logging.getLogger("kiln").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    harness.op_database()
    connection.send(("ready", None))
    while True:
        task = connection.recv()
        if task is None:
            return
        case = task.case
        try:
            op = harness.find_opinfo(case.op_name, case.variant)
            samples = harness.generate_samples(op, case, max_samples)
        except Exception as error:
            connection.send(("case error", "sample_inputs: " + harness._describe(error)))
            connection.send(("done", None))
            continue
        for index, sample in samples:
            if index < task.first_sample:
                continue
            connection.send(("start", index))
            result = harness.run_sample(op, sample, case, index, backend=backend, timeout=timeout)
            connection.send(("result", result))
        connection.send(("done", None))


class _Worker(WorkerProcess):
    """A sweep worker: the case it runs now, the sample it is on, how many cases it has run."""

    def __init__(self, context, worker_args: tuple) -> None:
        super().__init__(context, worker_main, worker_args, STARTUP_SECONDS)
        self.task: Task | None = None
        self.sample_index: int | None = None
        self.cases_done = 0

    def send(self, task: Task, hard_timeout: float) -> None:
        self.task, self.sample_index = task, None
        self.deadline = time.monotonic() + hard_timeout
        self.connection.send(task)


def run_pool(cases: list[Case], *, backend: str, jobs: int, max_samples: int | None,
             timeout: float | None, on_case_done: Callable[[CaseRecord], None] | None = None,
             log_path: str | None = None) -> list[CaseRecord]:
    """Run every case in `jobs` worker processes; returns one record per case, in order.

    The workers' stdout and stderr (torch's C++ warnings, faulthandler's dump of a crash)
    go to `log_path` when given.
    """
    context = multiprocessing.get_context("spawn")
    worker_args = (backend, max_samples, timeout, log_path)
    hard_timeout = (timeout or 600.0) + GRACE_SECONDS
    records = {case: CaseRecord(case) for case in cases}
    pending = collections.deque(Task(case) for case in cases)
    workers: list[_Worker] = []

    def finish(record: CaseRecord) -> None:
        record.finished = True
        record.samples.sort(key=lambda result: result.index)
        if on_case_done is not None:
            on_case_done(record)

    def bury(worker: _Worker, outcome: str, reason: str) -> None:
        """A worker died or hung: record the sample it was on and requeue the rest of its case."""
        workers.remove(worker)
        task = worker.task
        if task is None:
            if not worker.ready:  # died while starting: nothing will ever run
                raise RuntimeError(f"sweep worker could not start: {reason}")
            return
        record = records[task.case]
        if worker.sample_index is None:
            record.error = f"{outcome} before the first sample ({reason})"
            finish(record)
        else:
            record.samples.append(SampleResult(worker.sample_index, outcome, reason))
            pending.appendleft(Task(task.case, worker.sample_index + 1))

    try:
        while pending or any(worker.task for worker in workers):
            while len(workers) < jobs and pending:
                workers.append(_Worker(context, worker_args))
            for worker in workers:
                if worker.ready and worker.task is None and pending:
                    worker.send(pending.popleft(), hard_timeout)
            now = time.monotonic()
            next_deadline = min(worker.deadline for worker in workers)
            ready = wait([worker.connection for worker in workers], timeout=max(0.05, next_deadline - now))
            for connection in ready:
                worker = next(worker for worker in workers if worker.connection is connection)
                try:
                    kind, payload = connection.recv()
                except (EOFError, OSError):
                    bury(worker, Outcome.CRASH, worker.death_reason())
                    continue
                worker.deadline = time.monotonic() + hard_timeout
                if kind == "ready":
                    worker.ready = True
                elif kind == "start":
                    worker.sample_index = payload
                elif kind == "result":
                    records[worker.task.case].samples.append(payload)
                elif kind == "case error":
                    records[worker.task.case].error = payload
                elif kind == "done":
                    finish(records[worker.task.case])
                    worker.task, worker.cases_done = None, worker.cases_done + 1
                    if worker.cases_done >= CASES_PER_WORKER:
                        workers.remove(worker)
                        worker.stop()
            now = time.monotonic()
            for worker in [worker for worker in workers if worker.deadline < now]:
                silent_for = hard_timeout if worker.ready else STARTUP_SECONDS
                worker.kill()
                bury(worker, Outcome.TIMEOUT, f"worker silent for {silent_for:.0f} s, killed")
    except KeyboardInterrupt:
        print("sweep interrupted: writing what finished", file=sys.stderr)
    finally:
        for worker in workers:
            if worker.task is None and worker.process.is_alive():
                worker.stop()
            else:
                worker.kill()
    return [records[case] for case in cases]
