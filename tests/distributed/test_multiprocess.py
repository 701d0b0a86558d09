"""Two processes, gloo on CPU: kiln-compiled data-parallel training ends where eager training does.

Each test runs one scenario of tests/distributed/_workers.py in two spawned workers that share one
gloo group (started once for the file): each rank trains on its own data shard for 5 optimizer
steps, once eagerly (plain DDP, plain FSDP2) and once compiled with kiln's real backend (C++
kernels), from the same seeds. The final parameters and every step's loss must match eager's
within float32's tolerances on both ranks, the ranks must agree with each other, and kiln must
have compiled the model: graphs with kernels, no frame and no graph run eagerly.

A scenario that raises in a worker fails its test with the worker's traceback; a worker that
dies or stays silent past the deadline is killed (both are, the group being unusable then) and
the test fails with the tail of its log; the next test starts a fresh pair.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.connection import wait

import pytest
import torch
import torch.distributed as dist

from tests.distributed import _workers
from tests.worker_process import WorkerProcess

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not built")

STARTUP_SECONDS = 120.0   # spawning, importing torch and kiln, joining the group, on a loaded 2-core machine
SCENARIO_SECONDS = 120.0  # one scenario on both ranks, first compiles included
GRACE_SECONDS = 5.0       # after one rank fails, for the other's report before both are killed


class WorkerFailure(AssertionError):
    """A worker raised (its traceback follows), died, or stayed silent past its deadline."""


class NotCompiled(AssertionError):
    """The run matched eager, but kiln did not compile all of it (a frame or a graph ran eagerly)."""


class Pair:
    """The two workers, each with its log; `run(name)` runs one scenario on both and returns their results."""

    def __init__(self, folder):
        from kiln.config import config

        context = multiprocessing.get_context("spawn")
        store = os.path.join(folder, "store")
        self.logs = [os.path.join(folder, f"rank{rank}.log") for rank in range(_workers.WORLD_SIZE)]
        self.workers = [WorkerProcess(context, _workers.worker_main, (rank, store, self.logs[rank], config.cache_dir),
                                      STARTUP_SECONDS) for rank in range(_workers.WORLD_SIZE)]
        try:
            self._collect("ready", STARTUP_SECONDS, GRACE_SECONDS)
        except BaseException:
            self.kill()
            raise

    def run(self, name: str, seconds: float = SCENARIO_SECONDS, grace: float = GRACE_SECONDS) -> list:
        try:
            for worker in self.workers:
                worker.connection.send(name)
            return self._collect(name, seconds, grace)
        except BaseException:  # KeyboardInterrupt included: no worker outlives a failed scenario
            self.kill()
            raise

    def _collect(self, what: str, seconds: float, grace: float) -> list:
        results: dict = {}
        errors: dict = {}
        deadline = time.monotonic() + seconds
        pending = {worker.connection: rank for rank, worker in enumerate(self.workers)}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for connection in wait(list(pending), timeout=remaining):
                rank = pending.pop(connection)
                try:
                    status, payload = connection.recv()
                except (EOFError, OSError):
                    errors[rank] = self.workers[rank].death_reason()
                    continue
                if status == "error":
                    errors[rank] = payload
                else:
                    results[rank] = payload
                if errors:  # the other rank may be blocked in a collective: a short wait for its report
                    deadline = min(deadline, time.monotonic() + grace)
        if errors or pending:
            for rank in pending.values():
                errors.setdefault(rank, "no answer in time (hung?): killed")
            raise WorkerFailure(f"{what}: " + "\n".join(f"--- rank {rank}: {text}\n{self._log_tail(rank)}"
                                                         for rank, text in sorted(errors.items())))
        return [results[rank] for rank in range(_workers.WORLD_SIZE)]

    def _log_tail(self, rank: int) -> str:
        try:
            with open(self.logs[rank], errors="replace") as handle:
                tail = handle.read()[-3000:]
        except OSError:
            return ""
        return f"(log {self.logs[rank]}, last lines)\n{tail}" if tail.strip() else ""

    def alive(self) -> bool:
        return all(worker.process.is_alive() for worker in self.workers)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()

    def kill(self) -> None:
        for worker in self.workers:
            worker.kill()


@pytest.fixture(scope="module")
def pairs():
    """Every pair of workers the file started; all are stopped (or killed) at its end."""
    started: list = []
    yield started
    for pair in started:
        if pair.alive():
            pair.stop()
        else:
            pair.kill()
    assert not [worker.process.pid for pair in started for worker in pair.workers if worker.process.is_alive()]


@pytest.fixture
def workers(pairs, tmp_path_factory):
    """`workers(name)`: the scenario's results from both ranks, run by the file's pair of workers
    (a fresh pair after one failed)."""

    def run(name: str, **limits) -> list:
        if not pairs or not pairs[-1].alive():
            pairs.append(Pair(str(tmp_path_factory.mktemp("gloo"))))
        return pairs[-1].run(name, **limits)

    run.pairs = pairs
    return run


def _check_matches_eager(results: list) -> None:
    """On both ranks the compiled run's losses and final parameters are eager's; the ranks agree on the parameters."""
    for rank, result in enumerate(results):
        torch.testing.assert_close(torch.stack(result["losses"]), torch.stack(result["expected_losses"]),
                                   msg=lambda message: f"rank {rank}, losses of the 5 steps: {message}")
        assert result["params"].keys() == result["expected_params"].keys()
        for name, value in result["params"].items():
            torch.testing.assert_close(value, result["expected_params"][name],
                                       msg=lambda message: f"rank {rank}, parameter {name}: {message}")
    # each rank's losses are its own shard's; the parameters are the same on both ranks
    assert not torch.equal(torch.stack(results[0]["losses"]), torch.stack(results[1]["losses"]))
    for name, value in results[0]["params"].items():
        torch.testing.assert_close(value, results[1]["params"][name], msg=lambda message: f"{name} across ranks")


def _check_compiled(results: list, *, kiln_frontend: bool = True) -> None:
    """kiln compiled the model on both ranks: graphs with kernels, no graph and no frame run eagerly."""
    for rank, result in enumerate(results):
        facts = result["facts"]
        where = f"rank {rank}: {facts['summary']}"
        if not (facts["graphs"] >= 2 and facts["kernels"] > 0):  # a training graph is a forward and a backward
            raise NotCompiled(f"too few graphs or kernels compiled; {where}")
        if facts["fallback_graphs"] or facts["eager_warnings"]:
            raise NotCompiled(f"graphs ran eagerly; {where}")
        if kiln_frontend:
            if not facts["frames"] or facts["eager_frames"]:
                raise NotCompiled(f"frames ran eagerly; {where}")
            if not facts["entries_compiled"]:
                raise NotCompiled(f"a cache entry holds no graph; {where}")
        elif facts["dynamo_graphs"] < 1:  # TorchDynamo's capture: its graphs, each compiled by kiln's backend
            raise NotCompiled(f"TorchDynamo captured no graph; {where}")


# ---------------------------------------------------------------- DDP, three ways to compile it

def test_kiln_compile_of_ddp(workers):
    """kiln.compile(DDP(model)): DDP's forward runs as it is, the model's is compiled (kiln/api.py _DistributedCall)."""
    results = workers("ddp_kiln_compile_of_ddp")
    _check_matches_eager(results)
    _check_compiled(results)
    assert not results[0]["facts"]["breaks"], results[0]["facts"]["summary"]


def test_ddp_of_kiln_compiled_model(workers):
    results = workers("ddp_of_kiln_compile")
    _check_matches_eager(results)
    _check_compiled(results)
    assert not results[0]["facts"]["breaks"], results[0]["facts"]["summary"]


def test_torch_compile_of_ddp_with_kiln_backend(workers):
    """torch.compile(DDP(model), backend="kiln"): TorchDynamo captures, kiln's backend compiles every graph."""
    results = workers("ddp_torch_compile_of_ddp")
    _check_matches_eager(results)
    _check_compiled(results, kiln_frontend=False)


# ---------------------------------------------------------------- DDP's gradient buckets

def _check_buckets(results: list, least: int) -> None:
    """DDP reduced the gradients in `least` buckets or more, as many as eager DDP with the same cap."""
    for result in results:
        facts = result["facts"]
        assert facts["buckets"] == facts["expected_buckets"] >= least, facts


def test_kiln_compile_of_ddp_with_several_buckets(workers):
    results = workers("ddp_small_buckets")
    _check_buckets(results, 3)
    _check_matches_eager(results)
    _check_compiled(results)


def test_ddp_of_kiln_compiled_model_with_several_buckets(workers):
    results = workers("ddp_of_kiln_compile_small_buckets")
    _check_buckets(results, 3)
    _check_matches_eager(results)
    _check_compiled(results)


def test_torch_compile_of_ddp_with_several_buckets(workers):
    """TorchDynamo's DDPOptimizer splits the graph at the buckets' boundaries; kiln compiles each piece (it
    failed the first step with a FakeTensor until kiln/aot counted its AOTAutograd calls for Dynamo)."""
    results = workers("ddp_torch_compile_small_buckets")
    _check_buckets(results, 2)
    _check_matches_eager(results)
    _check_compiled(results, kiln_frontend=False)
    for result in results:
        facts = result["facts"]
        assert facts["graphs"] >= 2 * 2, facts["summary"]  # two pieces or more, each a forward and a backward


# ---------------------------------------------------------------- FSDP2 (fully_shard)

@pytest.fixture
def fsdp2():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.skip("this torch has no torch.distributed.fsdp.fully_shard (FSDP2)")


def test_fsdp2_of_kiln_compiled_blocks(workers, fsdp2):
    """fully_shard(kiln.compile(block)) for each block, then fully_shard(model): FSDP2's hooks run around
    each compiled block."""
    results = workers("fsdp2_per_block")
    _check_matches_eager(results)
    _check_compiled(results)


def test_kiln_compile_of_fsdp2_model(workers, fsdp2):
    """kiln.compile(model) of a model fully_shard'ed block by block and whole."""
    results = workers("fsdp2_whole_model_sharded_first")
    _check_matches_eager(results)
    _check_compiled(results)


def test_fsdp2_of_kiln_compiled_model(workers, fsdp2):
    """fully_shard of the blocks of a kiln-compiled model, then of the compiled model."""
    results = workers("fsdp2_whole_model_compiled_first")
    _check_matches_eager(results)
    _check_compiled(results)


# ---------------------------------------------------------------- the harness

def test_a_failing_rank_fails_the_test_with_its_traceback_and_a_hung_one_is_killed(workers):
    with pytest.raises(WorkerFailure) as failure:
        workers("rank1_raises_rank0_waits", grace=1.0)
    message = str(failure.value)
    assert "rank 1: Traceback" in message and "RuntimeError: rank 1 fails on purpose" in message, message
    assert "rank 0: no answer in time (hung?): killed" in message, message
    assert not workers.pairs[-1].alive()
