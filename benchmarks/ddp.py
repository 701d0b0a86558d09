"""Llama-style training with DistributedDataParallel: eager DDP, torch.compile DDP and kiln DDP, 1 and 2 GPUs.

    python -m benchmarks.ddp [--world-sizes 1,2] [--backends eager,inductor,kiln] [--form compile_ddp]
                             [--steps 30] [--warmup 3] [--bucket-cap-mb MB] [--small --device cpu]

Each (backend, world size) case runs in processes of its own, one per rank (NCCL and one GPU per rank on
CUDA, gloo on a CPU), rendezvous over a free local TCP port, each rank with its own empty compile caches,
and a timeout for the whole case. Every rank builds TARGETS.md's Llama-style model from its config with its
default settings (benchmarks/workloads.py; seed 0, so the same weights on every rank), wraps it in DDP
(`--form compile_ddp`: kiln.compile(DDP(m)) / torch.compile(DDP(m)); `ddp_of_compiled`: DDP(kiln.compile(m)) /
DDP(torch.compile(m))) and trains it with AdamW: a step is zero_grad + forward with labels = input_ids (bf16
autocast on CUDA, float32 on a CPU) + backward + optimizer step, on a batch of the rank's own (the batch per
GPU is fixed: 2 GPUs process twice the tokens). The first step is timed in wall seconds (compile), then
after 1 s of GPU spin-up and the warm-up steps, every timed step gets its own pair of CUDA events
(time.perf_counter on a CPU); a case's step time is the slowest rank's median, and tokens/s = world size x
batch x sequence / that median. Peak memory is torch.cuda.max_memory_allocated over the timed steps, per
rank. Scaling efficiency = tokens/s on 2 GPUs / (2 x tokens/s on 1 GPU), per backend. Losses: rank 0's loss
at every step, compared with eager's at the same world size (same weights, same batches).

Results: benchmarks/results/<date>_ddp-<label>_<hardware>.{md,json,log} (`--results-dir` elsewhere,
`--copy-to` a second folder), rewritten after every case; the hardware tag of a CUDA machine ends in
-x<GPUs> when it has several. The exit status is 1 when a case errored or timed out, or its losses
disagree with eager's.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from benchmarks import report

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("eager", "inductor", "kiln")
FORMS = ("compile_ddp", "ddp_of_compiled")
TITLES = {"eager": "eager DDP", "inductor": "torch.compile DDP", "kiln": "kiln DDP"}
# Losses agree with eager's when |loss - eager| <= rtol * |eager| at every step. bf16 (CUDA, autocast): four
# units of bf16's epsilon (2^-7), the spread of rounding a compiled graph may place elsewhere than eager,
# over a few dozen AdamW steps; float32 (CPU): 1e-4, far above float32's rounding and far below a wrong
# gradient's effect after a few steps.
LOSS_RTOL = {"bfloat16": 4 * 2 ** -7, "float32": 1e-4}
GRACE_S = 20.0  # after one rank fails, how long the others get to end before they are killed


# --------------------------------------------------------------------------- one rank (a child process)

def _compile(program, backend: str, kiln_backend: str):
    if backend == "inductor":
        import torch

        return torch.compile(program)
    if backend == "kiln":
        import kiln

        return kiln.compile(program, backend=kiln_backend)
    return program


def _counts(backend: str, recording) -> dict:
    """Graphs per rank: kiln's frontend's captured graphs and breaks and the ATen graphs its backend compiled
    (forward and backward, with those that fell back to eager); TorchDynamo's counters for torch.compile."""
    from benchmarks.case import capture_counts

    counts = capture_counts(backend)
    if recording is not None:
        counts["compiled_graphs"] = len(recording.graphs)
        counts["fallback_graphs"] = len(recording.fallback_graphs)
        if recording.fallback_graphs:
            counts["fallbacks"] = [graph.fallback[:200] for graph in recording.fallback_graphs[:3]]
    return counts


def rank_main(spec: dict, rank: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from benchmarks import timing
    from benchmarks.case import KilnLogCounter
    from benchmarks.workloads import build

    world_size, backend, cuda = spec["world_size"], spec["backend"], spec["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    else:
        device = "cpu"
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # the ranks share the CPU's cores
    kiln_log = KilnLogCounter()
    logging.getLogger("kiln").addHandler(kiln_log)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{spec['port']}",
                            rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=spec["collective_timeout_s"]),
                            **({"device_id": torch.device(device)} if cuda else {}))
    try:
        workload = build("models", "llama", spec["small"], device)  # seeds 0: the same weights on every rank
        model = workload.program.train()
        batch, seq = workload.train_kwargs["input_ids"].shape
        generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch
        input_ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=generator).to(device)
        ddp_options = {"device_ids": [rank]} if cuda else {}
        if spec.get("bucket_cap_mb") is not None:
            ddp_options["bucket_cap_mb"] = spec["bucket_cap_mb"]
        if backend == "eager":
            program = DistributedDataParallel(model, **ddp_options)
        elif spec["form"] == "compile_ddp":
            program = _compile(DistributedDataParallel(model, **ddp_options), backend, spec["kiln_backend"])
        else:
            program = DistributedDataParallel(_compile(model, backend, spec["kiln_backend"]), **ddp_options)
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec["lr"])
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
        losses: list = []

        def step():
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = program(input_ids=input_ids, labels=input_ids).loss
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())  # read after the timed steps: .item() would wait for the GPU

        recording = None
        with contextlib.ExitStack() as stack:
            if backend == "kiln":
                try:  # a private hook (tests/frontend/test_ddp.py counts graphs with it): absent is fine
                    from kiln.debug.explain import ExplainReport, _recording

                    recording = ExplainReport()
                    stack.enter_context(_recording(recording))
                except ImportError:
                    recording = None
            first_step_s, _ = timing.time_first_call(step, device)
            timing.spin_up(device, spec["spin_up_s"])
            for _ in range(spec["warmup"]):
                step()
            timing.synchronize(device)
            dist.barrier()
            timing.reset_peak_memory(device)
            started = time.perf_counter()
            times = timing.time_calls(step, device, spec["steps"])
            wall_s = time.perf_counter() - started
            peak_gib = timing.peak_memory_gib(device)
        result = {"status": "ok", "rank": rank, "batch": int(batch), "seq": int(seq),
                  "first_step_s": first_step_s, **timing.summarize(times),
                  "wall_ms_per_step": wall_s * 1000 / spec["steps"], "peak_gib": peak_gib,
                  "losses": [float(loss) for loss in losses]}
        if backend != "eager":
            result.update(_counts(backend, recording))
        if backend == "kiln":
            result["kiln_warnings"] = kiln_log.count
            result["kiln_first_warnings"] = kiln_log.first
        dist.barrier()  # no rank leaves (and tears down the group) while another is still stepping
        return result
    finally:
        dist.destroy_process_group()


def _rank_entry(spec_path: str, rank: int) -> int:
    """`python -m benchmarks.ddp --rank R SPEC_PATH`: one rank; its result goes to the spec's folder."""
    import traceback

    from benchmarks.case import error_summary

    with open(spec_path) as handle:
        spec = json.load(handle)
    try:
        result = rank_main(spec, rank)
    except BaseException as error:  # recorded, never hidden: the parent reports it
        traceback.print_exc()
        result = {"status": "error", "rank": rank, "error": error_summary(error)}
    with open(os.path.join(spec["scratch"], f"rank{rank}.json"), "w") as handle:
        json.dump(result, handle)
    return 0 if result["status"] == "ok" else 1


# --------------------------------------------------------------------------- one case (the parent's side)

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_environment(device: str, cache_dir: str) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if device == "cpu":
        env.setdefault("TRITON_INTERPRET", "1")  # kiln's Triton kernels run under the interpreter on a CPU
    # NVLink multicast stays off (NCCL's NVLS, symmetric memory, NVSHMEM): the lent multi-GPU machines require
    # it, whatever the parent's environment says
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    for variable, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                          ("KILN_CACHE_DIR", "kiln")):
        env[variable] = os.path.join(cache_dir, sub)
    return env


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else "(no output)"


def run_case(spec: dict, timeout: float, log) -> dict:
    """Run one (backend, world size) case, one process per rank; always return a record."""
    scratch = tempfile.mkdtemp(prefix="kiln_ddp_")
    world_size = spec["world_size"]
    spec = dict(spec, scratch=scratch, port=free_port())
    spec_path = os.path.join(scratch, "spec.json")
    with open(spec_path, "w") as handle:
        json.dump(spec, handle)
    record = {"backend": spec["backend"], "world_size": world_size, "form": spec["form"]}
    started = time.perf_counter()
    children, outputs = [], []
    status_note = None
    try:
        for rank in range(world_size):
            output = open(os.path.join(scratch, f"rank{rank}.log"), "w")
            outputs.append(output)
            env = _rank_environment(spec["device"], os.path.join(scratch, f"cache{rank}"))
            children.append(subprocess.Popen(
                [sys.executable, "-m", "benchmarks.ddp", "--rank", str(rank), spec_path], cwd=REPO_ROOT, env=env,
                stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = started + timeout
        failed_at = None
        while any(child.poll() is None for child in children):
            now = time.perf_counter()
            if failed_at is None and any(child.returncode not in (None, 0) for child in children):
                failed_at = now  # one rank is gone: the others would wait in a collective until its timeout
            if now > deadline or (failed_at is not None and now > failed_at + GRACE_S):
                status_note = "timeout" if now > deadline else "killed"
                for child in children:
                    if child.poll() is None:
                        try:  # its own process group: it and its compile workers
                            os.killpg(child.pid, signal.SIGKILL)
                        except ProcessLookupError:  # it ended meanwhile
                            pass
                for child in children:
                    child.wait()
                break
            time.sleep(0.2)
        for output in outputs:
            output.close()
        ranks, texts = [], []
        for rank, child in enumerate(children):
            with open(os.path.join(scratch, f"rank{rank}.log"), errors="replace") as handle:
                texts.append(handle.read())
            log.write(f"\n===== {record} rank {rank} (exit {child.returncode}) =====\n{texts[-1]}")
            result_path = os.path.join(scratch, f"rank{rank}.json")
            if os.path.exists(result_path):
                with open(result_path) as handle:
                    ranks.append(json.load(handle))
            else:
                ranks.append({"status": "timeout" if status_note == "timeout" else "error", "rank": rank,
                              "error": f"exit code {child.returncode}: {_last_line(texts[-1])}"})
        log.flush()
        record.update(merge_ranks(ranks, status_note, timeout))
    finally:
        for output in outputs:
            output.close()
        shutil.rmtree(scratch, ignore_errors=True)
    record["wall_s"] = round(time.perf_counter() - started, 2)
    return record


def merge_ranks(ranks: list[dict], status_note: str | None, timeout: float) -> dict:
    """A case from its ranks' results: ok when every rank is; the slowest rank's median step."""
    bad = [rank for rank in ranks if rank.get("status") != "ok"]
    if bad:
        errors = [rank for rank in bad if rank.get("status") == "error" and not rank["error"].startswith("exit code")]
        first = (errors or bad)[0]
        status = "timeout" if status_note == "timeout" and not errors else "error"
        reason = f"rank {first['rank']}: {first.get('error', '')}"
        if status == "timeout":
            reason = f"killed after {timeout:.0f} s; " + reason
        return {"status": status, "error": reason, "ranks": ranks}
    slowest = max(ranks, key=lambda rank: rank["median_ms"])
    world_size, batch, seq = len(ranks), ranks[0]["batch"], ranks[0]["seq"]
    merged = {
        "status": "ok", "batch": batch, "seq": seq, "shape": f"{batch} x {seq} tokens",
        "median_ms": slowest["median_ms"], "p20_ms": slowest["p20_ms"], "p80_ms": slowest["p80_ms"],
        "tokens_per_s": world_size * batch * seq / (slowest["median_ms"] / 1000.0),
        "first_step_s": max(rank["first_step_s"] for rank in ranks),
        "peak_gib": [rank["peak_gib"] for rank in ranks],
        "losses": ranks[0]["losses"], "last_loss": ranks[0]["losses"][-1],
        "ranks": [{key: value for key, value in rank.items() if key != "losses"} for rank in ranks],
    }
    for key in ("graphs", "graph_breaks", "eager_frames", "compiled_graphs", "fallback_graphs", "kiln_warnings"):
        if key in ranks[0]:
            merged[key] = [rank.get(key) for rank in ranks]
    return merged


# --------------------------------------------------------------------------- the run's derived numbers

def _ok(case: dict | None) -> bool:
    return case is not None and case.get("status") == "ok"


def derive(cases: list[dict], dtype: str) -> None:
    """Speedup over eager and the loss check (same world size), scaling efficiency (per backend), in place."""
    index = {(case["backend"], case["world_size"]): case for case in cases}
    rtol = LOSS_RTOL[dtype]
    for case in cases:
        if not _ok(case):
            continue
        eager = index.get(("eager", case["world_size"]))
        if case["backend"] != "eager" and _ok(eager):
            case["speedup"] = case["tokens_per_s"] / eager["tokens_per_s"]
            mine, theirs = case["losses"], eager["losses"]
            if len(mine) != len(theirs):
                case.update(losses_ok=False, loss_check=f"{len(mine)} losses against eager's {len(theirs)}")
            else:
                worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(mine, theirs))
                case["loss_max_rel_diff"] = worst
                case["losses_ok"] = worst <= rtol
                case["loss_check"] = (f"{'ok' if worst <= rtol else 'FAIL'}: max relative difference {worst:.2e} "
                                      f"over {len(mine)} steps (tolerance {rtol:.2g}, {dtype})")
        single = index.get((case["backend"], 1))
        if case["world_size"] > 1 and _ok(single):
            case["scaling_efficiency"] = case["tokens_per_s"] / (case["world_size"] * single["tokens_per_s"])


# --------------------------------------------------------------------------- tables

def _cell(case: dict | None, text) -> str:
    if case is None:
        return ""
    if not _ok(case):
        return case.get("status", "?")
    return text(case)


def _list_cell(values, digits: int = 2) -> str:
    return " / ".join("-" if value is None else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))
                      for value in values)


def _unit(plan: dict) -> str:
    """What a rank runs on: a GPU, or a share of the CPU."""
    return "GPU(s)" if plan["device"] == "cuda" else "rank(s)"


def markdown(env: dict, cases: list[dict], plan: dict, label: str) -> str:
    versions = ", ".join(f"{name} {env[name]}" for name in ("python", "torch", "cuda", "triton", "transformers")
                         if env.get(name))
    hardware = f"{env['gpus']} x {env['gpu']}" if env.get("gpu") else f"CPU only: {env['cpu']}"
    lines = [
        f"# kiln benchmarks: DDP training ({label})", "",
        f"- date: {env['date']}",
        f"- hardware: {hardware} ({env['cpu_count']} CPU cores)",
        f"- versions: {versions}",
        f"- kiln commit: {env['git_commit']}; kiln backend rung: {plan['kiln_backend']}",
        f"- command: `{env['command']}`",
        f"- method: {plan['method']}", "",
    ]
    index = {(case["backend"], case["world_size"]): case for case in cases}
    sizes = plan["world_sizes"]
    unit = "GPU" if plan["device"] == "cuda" else "rank"
    shape = next((case["shape"] for case in cases if _ok(case)), "Llama-style")
    lines += [f"## Tokens/s ({shape} per {unit}, {plan['form']}; x = over eager DDP at the same {unit} count)",
              ""]
    header = ["backend"]
    for size in sizes:
        header += [f"{size} {unit}{'s' if size > 1 else ''} tokens/s", "x"]
    header += [f"scaling to {size} {unit}s" for size in sizes if size > 1]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for backend in plan["backends"]:
        row = [TITLES[backend]]
        for size in sizes:
            case = index.get((backend, size))
            row += [_cell(case, lambda c: f"{c['tokens_per_s']:,.0f}"),
                    _cell(case, lambda c: f"{c['speedup']:.2f}" if "speedup" in c else "")]
        for size in sizes:
            if size > 1:
                case = index.get((backend, size))
                row.append(_cell(case, lambda c: f"{c['scaling_efficiency']:.2f}" if "scaling_efficiency" in c else ""))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"Scaling: tokens/s on N {unit}s / (N x tokens/s on 1 {unit}), same backend.", ""]
    lines += ["## All cases", ""]
    header = ["backend", f"{unit}s", "status", "median step ms (p20-p80)", "tokens/s", "first step s",
              f"peak GiB per {unit}", "graphs / breaks per rank", "compiled graphs per rank", "last loss (rank 0)",
              "losses vs eager"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for case in cases:
        ok = _ok(case)
        graphs = ""
        if ok and "graphs" in case:
            breaks = case.get("graph_breaks") or ["?"] * len(case["graphs"])
            graphs = ", ".join(f"{g} / {b}" for g, b in zip(case["graphs"], breaks))
        lines.append("| " + " | ".join([
            TITLES[case["backend"]], str(case["world_size"]), case.get("status", "?"),
            f"{case['median_ms']:.2f} ({case['p20_ms']:.2f}-{case['p80_ms']:.2f})" if ok else "",
            f"{case['tokens_per_s']:,.0f}" if ok else "",
            f"{case['first_step_s']:.2f}" if ok else "",
            _list_cell(case["peak_gib"]) if ok else "",
            graphs,
            _list_cell(case["compiled_graphs"]) if ok and "compiled_graphs" in case else "",
            f"{case['last_loss']:.5f}" if ok else "",
            (case.get("loss_check", "(the baseline)" if case["backend"] == "eager" else "no eager case to compare")
             if ok else case.get("error", "")).replace("|", "/")[:200],
        ]) + " |")
    problems = []
    for case in cases:
        name = f"{TITLES[case['backend']]}, {case['world_size']} {_unit(plan)}"
        if not _ok(case):
            problems.append(f"- {name}: **{case.get('status')}**: {case.get('error', '')}")
        elif case.get("losses_ok") is False:
            problems.append(f"- {name}: **losses FAIL**: {case['loss_check']}")
        if _ok(case) and any(case.get("fallback_graphs") or []):
            problems.append(f"- {name}: graphs run eagerly per rank: {_list_cell(case['fallback_graphs'])}")
        if _ok(case) and any(case.get("kiln_warnings") or []):
            first = "; ".join(case["ranks"][0].get("kiln_first_warnings", []))
            problems.append(f"- {name}: kiln warnings per rank {_list_cell(case['kiln_warnings'])}, e.g. {first}")
    lines += ["", "## Problems (errors, timeouts, skips, loss disagreements, kiln warnings)", ""]
    lines += (problems or ["none"]) + [""]
    return "\n".join(lines)


def write(folders: list[str], stem: str, env: dict, cases: list[dict], plan: dict, label: str) -> None:
    document = {"environment": env, "plan": plan, "cases": cases}
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
        for suffix, text in ((".md", markdown(env, cases, plan, label)),
                             (".json", json.dumps(document, indent=1, default=str))):
            path = os.path.join(folder, stem + suffix)
            with open(path + ".tmp", "w") as handle:
                handle.write(text)
            os.replace(path + ".tmp", path)


# --------------------------------------------------------------------------- command line

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ddp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="eager,inductor,kiln", help="comma list of " + ",".join(BACKENDS))
    parser.add_argument("--world-sizes", default="1,2", help="comma list of process (GPU) counts")
    parser.add_argument("--form", choices=FORMS, default="compile_ddp",
                        help="compile_ddp: compile(DDP(model)); ddp_of_compiled: DDP(compile(model))")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 30; 5 with --small)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps after the first (default 3; 1 --small)")
    parser.add_argument("--small", action="store_true", help="the shrunk Llama (2 layers, hidden 64, 2 x 16 tokens)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default: cuda when available and not --small, else cpu")
    parser.add_argument("--bucket-cap-mb", type=float, default=None,
                        help="DDP's bucket_cap_mb (default: DDP's own, 25)")
    parser.add_argument("--lr", type=float, default=3e-4, help="AdamW's learning rate")
    parser.add_argument("--spin-up", type=float, default=1.0, help="seconds of GPU matmuls after the first step")
    parser.add_argument("--kiln-backend", default=os.environ.get("KILN_BENCH_BACKEND", "kiln"),
                        help="kiln ladder rung for the kiln cases: kiln (default), aot_eager, eager")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case (all its ranks)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run; cases that would start after it are recorded as skipped")
    parser.add_argument("--label", default=None, help="file name part after 'ddp-' (default: llama, the form, -small)")
    parser.add_argument("--results-dir", default=os.path.join(REPO_ROOT, "benchmarks", "results"))
    parser.add_argument("--copy-to", default=None, help="also keep the .md/.json/.log current in this folder")
    args = parser.parse_args(argv)
    args.backends = report.names(args.backends)
    unknown = [name for name in args.backends if name not in BACKENDS]
    if unknown or not args.backends:
        raise SystemExit(f"unknown backend(s) {unknown}; choose from {list(BACKENDS)}")
    if "eager" in args.backends:  # the baseline first: each later case is compared with it
        args.backends = ["eager"] + [name for name in args.backends if name != "eager"]
    try:
        args.world_sizes = sorted({int(size) for size in report.names(args.world_sizes)})
    except ValueError:
        raise SystemExit(f"--world-sizes: integers, e.g. 1,2 (got {args.world_sizes!r})") from None
    if not args.world_sizes or args.world_sizes[0] < 1:
        raise SystemExit("--world-sizes: at least one positive count")
    args.steps = args.steps if args.steps is not None else (5 if args.small else 30)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.small else 3)
    return args


def choose_device(args) -> str:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here; use --small --device cpu")
    if args.device:
        return args.device
    if torch.cuda.is_available() and not args.small:
        return "cuda"
    if not args.small:
        raise SystemExit("no CUDA device: the full-size model needs GPUs; run with --small on a CPU")
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank"]:
        return _rank_entry(argv[2], int(argv[1]))
    args = parse_args(argv)
    import torch

    device = choose_device(args)
    command = "python -m benchmarks.ddp " + " ".join(shlex.quote(arg) for arg in argv)
    env = report.environment(device, REPO_ROOT, command)
    env["gpus"] = torch.cuda.device_count() if device == "cuda" else 0
    label = args.label or "-".join(["llama", args.form.replace("_", "-")] + (["small"] if args.small else []))
    tag = report.hardware_tag(env) + (f"-x{env['gpus']}" if env["gpus"] > 1 else "")
    stem = f"{datetime.date.today().isoformat()}_ddp-{label}_{tag}"
    dtype = "bfloat16" if device == "cuda" else "float32"
    method = (f"{device}, {'bf16 autocast, NCCL' if device == 'cuda' else 'float32, gloo'}; DDP "
              f"(bucket_cap_mb {args.bucket_cap_mb if args.bucket_cap_mb is not None else 'default'}), AdamW "
              f"(lr {args.lr:g}); a step = zero_grad + forward + loss + backward + optimizer step, "
              f"batch per GPU fixed; first step timed as compile time (wall); "
              f"{f'{args.spin_up:g} s of GPU spin-up, ' if device == 'cuda' and args.spin_up > 0 else ''}"
              f"{args.warmup} warm-up steps; {args.steps} timed steps "
              f"({'CUDA events' if device == 'cuda' else 'time.perf_counter'}), the slowest rank's median quoted; "
              f"each case in its own processes (one per rank) with cold compile caches; losses (rank 0, every "
              f"step) against eager's within a relative {LOSS_RTOL[dtype]:.2g}")
    plan = {"backends": args.backends, "world_sizes": args.world_sizes, "form": args.form, "device": device,
            "small": args.small, "steps": args.steps, "warmup": args.warmup,
            "bucket_cap_mb": args.bucket_cap_mb, "lr": args.lr, "kiln_backend": args.kiln_backend,
            "dtype": dtype, "loss_rtol": LOSS_RTOL[dtype], "method": method}
    folders = [args.results_dir] + ([args.copy_to] if args.copy_to else [])
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
    # The largest world size first: the comparison at 2 GPUs is the headline, 1 GPU gives the scaling.
    specs = [{"backend": backend, "world_size": size, "form": args.form, "device": device, "small": args.small,
              "steps": args.steps, "warmup": args.warmup, "spin_up_s": args.spin_up, "lr": args.lr,
              "bucket_cap_mb": args.bucket_cap_mb, "kiln_backend": args.kiln_backend,
              "collective_timeout_s": max(60.0, args.timeout)}
             for size in sorted(args.world_sizes, reverse=True) for backend in args.backends]
    print(f"kiln DDP benchmark: {len(specs)} cases on {env['gpu'] or 'CPU'}; results: "
          f"{os.path.join(args.results_dir, stem)}.{{md,json,log}}", flush=True)
    deadline = time.perf_counter() + args.budget if args.budget else None
    cases: list[dict] = []
    logs = [open(os.path.join(folder, stem + ".log"), "w") for folder in folders]
    log = report.Tee(logs)
    try:
        for position, spec in enumerate(specs, 1):
            remaining = deadline - time.perf_counter() if deadline else None
            case = {"backend": spec["backend"], "world_size": spec["world_size"], "form": args.form}
            if remaining is not None and remaining < 30:
                case.update(status="skipped", error=f"time budget of {args.budget:.0f} s spent")
            elif device == "cuda" and spec["world_size"] > env["gpus"]:
                case.update(status="skipped", error=f"needs {spec['world_size']} GPUs, this machine has {env['gpus']}")
            else:
                timeout = min(args.timeout, remaining) if remaining is not None else args.timeout
                case = run_case(spec, timeout, log)
            cases.append(case)
            derive(cases, dtype)
            print(_progress_line(position, len(specs), case, _unit(plan)), flush=True)
            write(folders, stem, env, cases, plan, label)
    finally:
        for handle in logs:
            handle.close()
    print()
    print(markdown(env, cases, plan, label))
    print(f"written: {os.path.join(args.results_dir, stem)}.{{md,json,log}}")
    failed = [case for case in cases if case.get("status") in ("error", "timeout") or case.get("losses_ok") is False]
    return 1 if failed else 0


def _progress_line(position: int, total: int, case: dict, unit: str) -> str:
    name = f"[{position}/{total}] {TITLES[case['backend']]}, {case['world_size']} {unit}"
    if not _ok(case):
        return f"{name}: {case.get('status')}: {case.get('error', '')}"
    return (f"{name}: {case['median_ms']:.4g} ms/step, {case['tokens_per_s']:,.0f} tokens/s, first step "
            f"{case['first_step_s']:.1f} s, peak GiB {_list_cell(case['peak_gib'])}, last loss {case['last_loss']:.5f}"
            f"{'  ' + case['loss_check'] if 'loss_check' in case else ''}  ({case['wall_s']:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
