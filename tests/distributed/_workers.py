"""The worker side of tests/distributed/test_multiprocess.py: two spawned processes, one gloo group.

Each worker joins the group once (a FileStore in the test's temporary folder), then runs the
scenarios the parent names, one at a time, and sends back what the parent compares: the final
parameters and the losses of the compiled run and of the eager one (same seeds, same data shard),
and what kiln compiled meanwhile. A scenario that raises sends its traceback instead.
Both workers use the parent's kiln cache folder (KILN_CACHE_DIR), so a kernel either builds is
built once and found there by the other, and by the next run.
"""
from __future__ import annotations

import datetime
import faulthandler
import logging
import os
import time
import traceback
import warnings

import torch
import torch.distributed as dist

WORLD_SIZE = 2
STEPS = 5
BATCH = 4
COLLECTIVE_TIMEOUT_S = 60  # a rank waiting on one that died gives up (the parent kills it before)


def worker_main(connection, rank: int, store_path: str, log_path: str, cache_dir: str) -> None:
    """Join the group, say "ready", then run the scenarios received on `connection` until a None."""
    from tests.worker_process import redirect_output

    redirect_output(log_path)
    os.environ["KILN_CACHE_DIR"] = cache_dir  # read when kiln is imported, below
    faulthandler.enable()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)  # two workers share CI's two cores
    import kiln  # noqa: F401 (registers torch.compile's backend="kiln")

    logging.getLogger("kiln").setLevel(logging.WARNING)
    store = dist.FileStore(store_path, WORLD_SIZE)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    connection.send(("ready", os.getpid()))
    try:
        while True:
            try:
                name = connection.recv()
            except EOFError:  # the parent is gone
                return
            if name is None:
                return
            try:
                result = SCENARIOS[name](rank)
            except BaseException:  # noqa: BLE001 (the parent fails the test with it)
                connection.send(("error", traceback.format_exc()))
            else:
                connection.send(("done", result))
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- model, data, training

class MLP(torch.nn.Module):
    """Linear layers with GELU between them. A class of the test's own: TorchDynamo starts no frame in
    torch.nn's files (a plain nn.Sequential under torch.compile(DDP(...)) is never compiled)."""

    def __init__(self, widths=(8, 32, 32, 4)):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x) if index == 0 else layer(torch.nn.functional.gelu(x))
        return x


class Block(torch.nn.Module):
    def __init__(self, width_in, width_out):
        super().__init__()
        self.linear = torch.nn.Linear(width_in, width_out)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))


class Blocks(torch.nn.Module):
    """Two blocks (Linear+GELU) and a head: what FSDP2 shards block by block."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(8, 32), Block(32, 32)])
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _mlp(widths=(8, 32, 32, 4)) -> torch.nn.Module:
    torch.manual_seed(0)
    return MLP(widths)


def _blocks() -> torch.nn.Module:
    torch.manual_seed(0)
    return Blocks()


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s shard of step `step`'s data: different on each rank, the same in every run."""
    generator = torch.Generator().manual_seed(1000 + WORLD_SIZE * step + rank)
    return torch.randn(BATCH, 8, generator=generator), torch.randn(BATCH, 4, generator=generator)


def _train(call, parameters, rank: int) -> list[torch.Tensor]:
    """STEPS optimizer steps (SGD with momentum) of `call` on this rank's shard; the losses."""
    optimizer = torch.optim.SGD(list(parameters), lr=0.05, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(call(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach().clone())
    return losses


def _parameters(model: torch.nn.Module) -> dict:
    """Full (unsharded) copies of the parameters, by the plain model's names."""
    out = {}
    for name, value in model.named_parameters():
        value = value.detach()
        if hasattr(value, "full_tensor"):  # FSDP2's DTensor shards
            value = value.full_tensor()
        out[name.replace("_orig_mod.", "")] = value.clone()
    return out


class _Recording:
    """What kiln compiled during a run (kiln.debug.explain's recorder), as plain data for the parent."""

    def __init__(self):
        from kiln.debug.explain import ExplainReport

        self.report = ExplainReport()

    def __enter__(self):
        from kiln.debug.explain import _recording

        self._context = _recording(self.report)
        self._context.__enter__()
        return self

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)

    def facts(self, **more) -> dict:
        report = self.report
        return {"frames": len(report.frames),
                "eager_frames": [frame.eager_reason for frame in report.eager_frames],
                "breaks": [f"{item.reason} at {item.location}" for item in report.breaks],
                "graphs": len(report.graphs),
                "kernels": report.kernel_count,
                "fallback_graphs": [f"{graph.name}: {graph.fallback}" for graph in report.fallback_graphs],
                "eager_warnings": [warning for warning in report.warnings if "eagerly" in warning],
                "summary": str(report).split("\nframe 0:")[0],
                **more}


def _result(model, losses, reference, expected_losses, facts) -> dict:
    return {"params": _parameters(model), "losses": losses,
            "expected_params": _parameters(reference), "expected_losses": expected_losses, "facts": facts}


def _entries_compiled(compiled_module) -> bool:
    dispatcher = compiled_module._compiled_call
    entries = list(dispatcher.entries)
    for forward in getattr(dispatcher, "forward_dispatchers", []):  # FSDP2's hooks run in Python, forward compiled
        entries += forward.entries
    # none runs its frame eagerly (a frame that breaks before any tensor work, at a sharded block's call, holds no
    # graph of its own: its resume functions do, and the facts count their graphs)
    return bool(entries) and all(entry.eager_reason is None for entry in entries)


# ---------------------------------------------------------------- DDP

SMALL_BUCKET_MB = 1e-4  # ~100 bytes: after DDP rebuilds its buckets (first step), about one parameter a bucket
WIDE = (8, 512, 512, 512, 4)  # 2 MiB of parameters: 1 MiB buckets, the least TorchDynamo's DDPOptimizer takes


def _ddp(model, bucket_cap_mb=None):
    options = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    return torch.nn.parallel.DistributedDataParallel(model, **options)


def _bucket_count(ddp) -> int:
    """How many gradient buckets DDP reduced (in its rebuilt layout, from the second step on)."""
    data = ddp._get_ddp_logging_data()
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes", "")
    return len([size for size in str(sizes).split(",") if size.strip()])


def _eager_ddp(rank, widths, bucket_cap_mb):
    reference = _mlp(widths)
    ddp = _ddp(reference, bucket_cap_mb)
    losses = _train(ddp, reference.parameters(), rank)
    return reference, losses, _bucket_count(ddp)


def _ddp_scenario(rank: int, form: str, widths=(8, 32, 32, 4), bucket_cap_mb=None) -> dict:
    """One of the three forms against eager DDP with the same bucket cap."""
    import kiln
    from torch._dynamo.utils import counters

    reference, expected, expected_buckets = _eager_ddp(rank, widths, bucket_cap_mb)
    model = _mlp(widths)
    torch._dynamo.reset()
    counters.clear()
    if form == "kiln.compile(DDP(m))":
        ddp = _ddp(model, bucket_cap_mb)
        compiled = call = kiln.compile(ddp)
    elif form == "DDP(kiln.compile(m))":
        compiled = kiln.compile(model)
        ddp = call = _ddp(compiled, bucket_cap_mb)
    elif form == "torch.compile(DDP(m), backend='kiln')":
        ddp = _ddp(model, bucket_cap_mb)
        compiled, call = None, torch.compile(ddp, backend="kiln")
    else:
        raise ValueError(form)
    with _Recording() as recording:
        losses = _train(call, model.parameters(), rank)
    facts = recording.facts(buckets=_bucket_count(ddp), expected_buckets=expected_buckets,
                            dynamo_graphs=counters["stats"]["unique_graphs"])
    if compiled is not None:
        facts["entries_compiled"] = _entries_compiled(compiled)
    torch._dynamo.reset()
    return _result(model, losses, reference, expected, facts)


def ddp_kiln_compile_of_ddp(rank: int) -> dict:
    return _ddp_scenario(rank, "kiln.compile(DDP(m))")


def ddp_of_kiln_compile(rank: int) -> dict:
    return _ddp_scenario(rank, "DDP(kiln.compile(m))")


def ddp_torch_compile_of_ddp(rank: int) -> dict:
    return _ddp_scenario(rank, "torch.compile(DDP(m), backend='kiln')")


def ddp_small_buckets(rank: int) -> dict:
    return _ddp_scenario(rank, "kiln.compile(DDP(m))", bucket_cap_mb=SMALL_BUCKET_MB)


def ddp_of_kiln_compile_small_buckets(rank: int) -> dict:
    return _ddp_scenario(rank, "DDP(kiln.compile(m))", bucket_cap_mb=SMALL_BUCKET_MB)


def ddp_torch_compile_small_buckets(rank: int) -> dict:
    """TorchDynamo's DDPOptimizer splits the graph at the buckets' boundaries (it refuses caps under 1 MiB)."""
    return _ddp_scenario(rank, "torch.compile(DDP(m), backend='kiln')", widths=WIDE, bucket_cap_mb=1)


# ---------------------------------------------------------------- FSDP2

def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (WORLD_SIZE,))  # fully_shard's default mesh is on the GPU where there is one


def _sharded(model, mesh, compile_block=None):
    """fully_shard each block (kiln-compiled first when `compile_block` says how), then the model."""
    from torch.distributed.fsdp import fully_shard

    for index in range(len(model.blocks)):
        if compile_block is not None:
            model.blocks[index] = compile_block(model.blocks[index])
        fully_shard(model.blocks[index], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp2_scenario(rank: int, form: str) -> dict:
    import kiln

    mesh = _mesh()
    reference = _sharded(_blocks(), mesh)
    expected = _train(reference, reference.parameters(), rank)
    if form == "per block":  # fully_shard(kiln.compile(block)) for each block, then fully_shard(model)
        model = call = _sharded(_blocks(), mesh, kiln.compile)
        compiled_modules = list(model.blocks)
    elif form == "whole model, sharded first":  # kiln.compile of the model fully_shard'ed block by block and whole
        model = _sharded(_blocks(), mesh)
        call = kiln.compile(model)
        compiled_modules = [call]
    elif form == "whole model, compiled first":  # kiln.compile(model), then fully_shard its blocks and it
        from torch.distributed.fsdp import fully_shard

        plain = _blocks()
        model = call = kiln.compile(plain)
        for block in plain.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        compiled_modules = [model]
    else:
        raise ValueError(form)
    with _Recording() as recording:
        losses = _train(call, model.parameters(), rank)
    facts = recording.facts(entries_compiled=all(_entries_compiled(module) for module in compiled_modules))
    return _result(model, losses, reference, expected, facts)


def fsdp2_per_block(rank: int) -> dict:
    return _fsdp2_scenario(rank, "per block")


def fsdp2_whole_model_sharded_first(rank: int) -> dict:
    return _fsdp2_scenario(rank, "whole model, sharded first")


def fsdp2_whole_model_compiled_first(rank: int) -> dict:
    return _fsdp2_scenario(rank, "whole model, compiled first")


# ---------------------------------------------------------------- the harness itself

def rank1_raises_rank0_waits(rank: int) -> dict:
    """Rank 1 raises; rank 0 waits for it in a collective that never completes."""
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.barrier()
    time.sleep(3600)
    return {}


SCENARIOS = {function.__name__: function for function in (
    ddp_kiln_compile_of_ddp, ddp_of_kiln_compile, ddp_torch_compile_of_ddp, ddp_small_buckets,
    ddp_of_kiln_compile_small_buckets, ddp_torch_compile_small_buckets, fsdp2_per_block,
    fsdp2_whole_model_sharded_first, fsdp2_whole_model_compiled_first, rank1_raises_rank0_waits)}
