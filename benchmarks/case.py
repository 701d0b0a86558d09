"""One benchmark case, in its own process: `python -m benchmarks.case SPEC_JSON RESULT_PATH`.

A case is (workload, backend, mode). It builds the workload, compiles it, times the
first call (compile time, wall seconds), runs warm-up calls, times the measured calls,
records peak GPU memory, and then checks the compiled result with
`kiln.testing.compare` against eager (same precision) and a float64 reference (the
program in float64, without autocast, on the same inputs). The result is one JSON
object written to RESULT_PATH; an exception is recorded there too, never hidden.

Backends: eager (the program itself), inductor (`torch.compile`), kiln (`kiln.compile`,
whose ladder rung is the spec's `kiln_backend`, "kiln" unless asked otherwise).
Modes: infer (`torch.no_grad()`), cudagraphs (infer with mode="reduce-overhead"), autotune (infer with
mode="max-autotune-no-cudagraphs": kiln's product templates and kernel configs timed, Inductor's autotuning),
train (forward + loss.backward(), no optimizer step; gradients set to None before each call), train-cudagraphs
(train with mode="reduce-overhead").
"""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import sys
import traceback
from typing import Any

import torch

from benchmarks import timing
from benchmarks.workloads import MissingDependency, Workload, build


class KilnLogCounter(logging.Handler):
    """Counts kiln's warnings (a graph that ran eagerly logs one) and keeps the first few."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.first) < 3:
            self.first.append(record.getMessage().splitlines()[0][:300])


def error_summary(error: BaseException) -> str:
    """One line saying what went wrong: the exception's last meaningful line (TorchDynamo
    wraps backend errors in a message that ends with boilerplate about TORCHDYNAMO_VERBOSE)."""
    text = "".join(traceback.format_exception_only(type(error), error))
    boilerplate = ("Set TORCHDYNAMO_VERBOSE", "For even more developer context", "You can suppress this exception")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(boilerplate)]
    summary = lines[-1] if lines else type(error).__name__
    if not summary.startswith(type(error).__name__) and ":" not in summary.split(" ")[0]:
        summary = f"{type(error).__name__}: {summary}"
    return summary[:500]


def compile_program(program, backend: str, mode: str, kiln_backend: str):
    """The program as the backend runs it."""
    # autotuning alone, without CUDA graphs (which torch's and kiln's "max-autotune" also turn on)
    compile_mode = {"cudagraphs": "reduce-overhead", "train-cudagraphs": "reduce-overhead",
                    "autotune": "max-autotune-no-cudagraphs"}.get(mode, "default")
    if backend == "eager":
        return program
    if backend == "inductor":
        return torch.compile(program, mode=None if compile_mode == "default" else compile_mode)
    if backend == "kiln":
        import kiln

        return kiln.compile(program, mode=compile_mode, backend=kiln_backend)
    raise ValueError(f"unknown backend {backend!r}")


def is_training(mode: str) -> bool:
    return mode in ("train", "train-cudagraphs")


def snapshot(value: Any) -> Any:
    """A detached copy of every tensor in `value` (CUDA-graph outputs are overwritten by the next call)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if hasattr(value, "to_tuple"):  # transformers ModelOutput
        value = value.to_tuple()
    if isinstance(value, (list, tuple)):
        return tuple(snapshot(item) for item in value)
    if isinstance(value, dict):
        return {key: snapshot(item) for key, item in value.items()}
    return value


class Runner:
    """Calls one workload through one callable in one mode, the same way every time."""

    def __init__(self, workload: Workload, callable_program, mode: str, device: str, use_autocast: bool,
                 mark_cudagraph_steps: bool):
        self.workload = workload
        self.program = callable_program
        self.mode = mode
        self.device = device
        self.use_autocast = use_autocast and workload.autocast
        self.mark_cudagraph_steps = mark_cudagraph_steps

    def autocast(self):
        if self.use_autocast:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def zero_grad(self) -> None:
        if self.workload.is_module:
            self.workload.program.zero_grad(set_to_none=True)

    def __call__(self):
        if self.mark_cudagraph_steps:
            torch.compiler.cudagraph_mark_step_begin()
        work = self.workload
        if is_training(self.mode):
            with self.autocast():
                output = self.program(*work.train_args, **work.train_kwargs)
                loss = work.loss_of(output)
            loss.backward()
            return loss
        with torch.no_grad(), self.autocast():
            # Kept until the next call, as `out = model(x)` in a user's loop keeps it: the previous result is
            # alive while the next call runs (what CUDA graphs must allow for).
            self.last_output = self.program(*work.infer_args, **work.infer_kwargs)
        return self.last_output

    def result_for_checking(self):
        """Inference: the outputs. Training: (loss, every parameter's gradient)."""
        self.zero_grad()
        value = snapshot(self())
        if not is_training(self.mode):
            return value
        # A parameter that got no gradient counts as a zero gradient: a compiled backward may
        # materialize zeros where eager leaves None (torch.compile does, e.g. BERT's unused pooler).
        gradients = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                     for p in self.workload.program.parameters()]
        return (value, gradients)


def float64_reference(workload: Workload, mode: str, device: str):
    """The program in float64, without autocast, on the same inputs (inputs cast, integers kept)."""
    from kiln.testing import to_float64

    program = workload.program
    if workload.is_module:
        program = copy.deepcopy(program).to(torch.float64)
    reference = copy.copy(workload)
    reference.program = program
    reference.infer_args = to_float64(workload.infer_args)
    reference.infer_kwargs = to_float64(workload.infer_kwargs)
    reference.train_args = to_float64(workload.train_args)
    reference.train_kwargs = to_float64(workload.train_kwargs)
    runner = Runner(reference, program, mode, device, use_autocast=False, mark_cudagraph_steps=False)
    return runner.result_for_checking()


def check_accuracy(workload: Workload, compiled_runner: Runner, eager_runner: Runner, mode: str) -> dict:
    from kiln.testing import compare

    actual = compiled_runner.result_for_checking()
    eager = eager_runner.result_for_checking()
    reference = float64_reference(workload, mode, eager_runner.device)
    if not is_training(mode):
        verdict = compare(actual, eager, reference)
        return {"accuracy_ok": bool(verdict.ok), "accuracy": verdict.message}
    # Training: the loss and the gradients judged apart, so that one verdict does not hide the other (a
    # loss is one number: its error against float64 is a single draw of the forward's rounding)
    loss = compare(actual[0], eager[0], reference[0])
    gradients = compare(actual[1], eager[1], reference[1])
    message = "ok" if loss and gradients else \
        f"loss: {loss.message}; gradients ({len(eager[1])}): {gradients.message}"
    return {"accuracy_ok": bool(loss and gradients), "accuracy": message,
            "loss_accuracy_ok": bool(loss), "gradients_accuracy_ok": bool(gradients)}


def capture_counts(backend: str) -> dict:
    """Graphs captured and graph breaks: kiln's frontend's counters for kiln (unless it was told to
    use Dynamo), TorchDynamo's for inductor."""
    if backend == "kiln":
        from kiln.config import config

        counts = cuda_graph_counts()
        if config.frontend == "kiln":
            from kiln.frontend.dispatcher import stats

            return {"graphs": stats.graphs, "graph_breaks": stats.breaks, "eager_frames": stats.eager_frames,
                    **counts}
    try:
        from torch._dynamo.utils import counters

        return {"graphs": int(counters["stats"]["unique_graphs"]),
                "graph_breaks": int(sum(counters["graph_break"].values()))}
    except Exception:  # a private API: absent is fine
        return {}


def cuda_graph_counts() -> dict:
    """kiln's CUDA-graph runners (mode="reduce-overhead"): replays, calls run without the graph, and why
    graphs were turned off; empty when there are none."""
    import gc

    from kiln.runtime.cudagraphs import CudaGraphRunner

    runners = [item for item in gc.get_objects() if isinstance(item, CudaGraphRunner)]
    if not runners:
        return {}
    return {"cuda_graph_replays": sum(runner.replays for runner in runners),
            "cuda_graph_plain_calls": sum(runner.plain_calls for runner in runners),
            "cuda_graphs_off": sorted({runner.disabled_reason for runner in runners if runner.disabled_reason})}


def run_case(spec: dict) -> dict:
    device, mode, backend = spec["device"], spec["mode"], spec["backend"]
    result: dict = {}
    kiln_log = KilnLogCounter()
    logging.getLogger("kiln").addHandler(kiln_log)
    if backend == "kiln" and spec.get("kiln_strict"):
        import kiln

        kiln.config.strict = True

    workload = build(spec["suite"], spec["workload"], spec["small"], device)
    result["shape"] = workload.shape
    if workload.bytes_moved is not None:
        result["bytes_moved"] = workload.bytes_moved
    if is_training(mode):
        if workload.loss_of is None:
            return {**result, "status": "skipped", "error": "no training mode for this workload"}
        workload.program.train()
    elif workload.is_module:
        workload.program.eval()

    use_autocast = device.startswith("cuda")
    compiled = compile_program(workload.program, backend, mode, spec.get("kiln_backend", "kiln"))
    runner = Runner(workload, compiled, mode, device, use_autocast,
                    mark_cudagraph_steps=(backend == "inductor" and mode in ("cudagraphs", "train-cudagraphs")))
    before_each = runner.zero_grad if is_training(mode) else None

    if before_each:
        before_each()
    result["first_call_s"], _ = timing.time_first_call(runner, device)
    timing.spin_up(device, spec.get("spin_up_s", 0.0))
    for _ in range(spec["warmup"]):
        if before_each:
            before_each()
        runner()
    timing.synchronize(device)
    timing.reset_peak_memory(device)
    times = timing.time_calls(runner, device, spec["iterations"], before_each)
    result.update(timing.summarize(times))
    result["peak_gib"] = timing.peak_memory_gib(device)
    result["peak_reserved_gib"] = timing.peak_reserved_gib(device)
    if workload.bytes_moved is not None:
        result["gb_per_s"] = workload.bytes_moved / (result["median_ms"] / 1000.0) / 1e9

    if backend != "eager" and spec.get("check", True):
        eager_runner = Runner(workload, workload.program, mode, device, use_autocast, mark_cudagraph_steps=False)
        result.update(check_accuracy(workload, runner, eager_runner, mode))
    result.update(capture_counts(backend) if backend != "eager" else {})
    if backend == "kiln":
        result["kiln_warnings"] = kiln_log.count
        result["kiln_first_warnings"] = kiln_log.first
    result["status"] = "ok"
    return result


def main(argv: list[str]) -> int:
    spec_text, result_path = argv[1], argv[2]
    spec = json.loads(spec_text)
    try:
        result = run_case(spec)
    except MissingDependency as error:
        result = {"status": "skipped", "error": str(error)}
    except BaseException as error:  # recorded, never hidden: the parent reports it
        traceback.print_exc()
        result = {"status": "error", "error": error_summary(error)}
    with open(result_path, "w") as handle:
        json.dump(result, handle)
    return 0 if result["status"] in ("ok", "skipped") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
