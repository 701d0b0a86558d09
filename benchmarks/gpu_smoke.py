"""GPU smoke check of kiln's generated kernels (run on the device machine before long benchmarks).

Compiles a handful of fused programs on CUDA in fp32 and bf16 and checks each against
eager with kiln's accuracy rule (float64 reference). Then mode="reduce-overhead" (CUDA
graphs) on a small Llama and a small ResNet: several calls with new inputs each, every
result checked against eager, and how many calls replayed a graph; then the Llama with new
sequence lengths (a recording per length). Last, mode="max-autotune" and "max-autotune-no-cudagraphs" on
a bf16 MLP: its products' tiles and its kernels' configs timed (choices counted in a fresh cache), three
calls each checked. Between them, the default mode's CUDA graphs: results kept across later calls, checked
(check_default_mode_cuda_graphs), and training steps under mode="reduce-overhead" (check_training_cuda_graphs:
each step's loss and gradients against eager's and float64's, the forward and backward replayed). One line per case.
"""
from __future__ import annotations

import copy
import gc
import sys
import traceback

import torch

import kiln
import kiln.testing

F = torch.nn.functional
CASES = {
    "sin_plus_sin": (lambda x, y: torch.sin(x) + torch.sin(y), lambda dt: (torch.randn(1 << 20, dtype=dt),
                                                                             torch.randn(1 << 20, dtype=dt))),
    "gelu_bias": (lambda x, b: F.gelu(x + b), lambda dt: (torch.randn(512, 4096, dtype=dt), torch.randn(4096, dtype=dt))),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4096,), w, b),
                   lambda dt: (torch.randn(512, 4096, dtype=dt), torch.randn(4096, dtype=dt), torch.randn(4096, dtype=dt))),
    "softmax_persistent": (lambda x: torch.softmax(x, -1), lambda dt: (torch.randn(512, 4096, dtype=dt),)),
    "softmax_looped": (lambda x: torch.softmax(x, -1), lambda dt: (torch.randn(64, 20000, dtype=dt),)),
    "reductions": (lambda x: (x.sum(0), x.argmax(1), torch.var_mean(x, 1), x.amin(1)),
                   lambda dt: (torch.randn(300, 9000, dtype=dt),)),
    "gather_cat": (lambda x, i: torch.cat([x[i], x[i] * 2], 1).sum(1), lambda dt: (torch.randn(100, 64, dtype=dt),
                                                                                  torch.randint(0, 100, (50,)))),
}


def main() -> int:
    failures = 0
    for dtype in (torch.float32, torch.bfloat16):
        for name, (fn, make) in CASES.items():
            torch._dynamo.reset()
            args = [a.cuda() for a in make(dtype)]
            try:
                with kiln.config.patch(strict=True):
                    out = kiln.compile(fn)(*args)
                verdict = kiln.testing.compare(out, fn(*args), fn(*kiln.testing.to_float64(args)))
                print(f"{name:20} {str(dtype):15} {'ok' if verdict else 'MISMATCH ' + verdict.message}", flush=True)
                failures += not verdict
            except Exception:
                failures += 1
                print(f"{name:20} {str(dtype):15} ERROR {traceback.format_exc()[-1500:]}", flush=True)
    failures += check_cuda_graphs()
    failures += check_default_mode_cuda_graphs()
    failures += check_training_cuda_graphs()
    failures += check_max_autotune()
    print(f"{failures} failures")
    return 1 if failures else 0


def _report(line: str, failed: bool) -> int:
    """Print a check's summary line, marked FAILED where the check failed (a count with no line once hid which
    check failed), and return 1 for a failure."""
    print(line + ("  FAILED" if failed else ""), flush=True)
    return int(bool(failed))


def _small_models():
    import torchvision
    import transformers

    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=512, vocab_size=1000)
    llama = transformers.LlamaForCausalLM(config).cuda().eval()
    resnet = torchvision.models.resnet18(num_classes=10).cuda().eval()
    return [("llama", lambda m, ids: m(input_ids=ids).logits, llama, lambda: (torch.randint(0, 1000, (2, 64)),)),
            ("resnet18", lambda m, x: m(x), resnet, lambda: (torch.randn(4, 3, 64, 64),))]


def check_cuda_graphs() -> int:
    """mode="reduce-overhead", under both result policies (kiln/runtime/cudagraphs.py): each call's result
    vs eager, and how many calls replayed.
    - default: results are released before the next call, which must replay;
    - cudagraph_invalidate: an `out = model(x)` loop (the previous result alive during the call) must
      replay too, and reading a result after the next call must raise, saying to keep a .clone()."""
    failures = 0
    for invalidate in (False, True):
        with kiln.config.patch(cudagraph_invalidate=invalidate):
            for name, call, model, make in _small_models():
                failures += _check_cuda_graph_model(name, call, model, make, keep_results=invalidate)
    return failures + _check_cuda_graph_sizes()


def _check_cuda_graph_sizes() -> int:
    """New sequence lengths under mode="reduce-overhead" (the defaults: results kept alive, up to
    config.cudagraph_max_shapes recordings per graph): the second length makes the graph
    shape-generic, and each length then gets a recording of its own. Every call vs eager."""
    name, call, model, _ = _small_models()[0]
    torch._dynamo.reset()
    gc.collect()
    failures = 0
    lengths = (64, 64, 64, 96, 96, 96, 128, 128, 128, 64, 96, 128)
    try:
        compiled = kiln.compile(model, mode="reduce-overhead")
        model64 = copy.deepcopy(model).double()
        out = None
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for step, length in enumerate(lengths):
                ids = torch.randint(0, 1000, (2, length), device="cuda")
                out = call(compiled, ids)  # the previous result alive during the call, as in a user's loop
                verdict = _compare(call, out, model, model64, [ids])
                if not verdict:
                    failures += 1
                    print(f"cudagraphs sizes      {name:10} call {step} (length {length}) MISMATCH {verdict.message}",
                          flush=True)
            del out
        runners, totals, disabled = _runner_totals()
        failures += _report(f"cudagraphs sizes      {name:10} {len(lengths)} calls, lengths {sorted(set(lengths))} "
                            f"checked; runners {runners}, recordings {totals['recordings']}, replays "
                            f"{totals['replays']}, plain calls {totals['plain_calls']}, disabled {disabled}",
                            not totals["replays"] or totals["plain_calls"] > 0 or bool(disabled))
    except Exception:
        failures += 1
        print(f"cudagraphs sizes      {name:10} ERROR {traceback.format_exc()[-1500:]}", flush=True)
    return failures


def _compare(call, out, model, model64, args) -> kiln.testing.Verdict:
    """A compiled result (bf16 autocast) vs eager's and a float64 reference's, on the same arguments."""
    got, want = out.float().clone(), call(model, *args).float()
    with torch.autocast("cuda", enabled=False):
        reference = call(model64, *[a.double() if a.is_floating_point() else a for a in args]).float()
    return kiln.testing.compare(got, want, reference, factor=3.0)


def _runner_totals() -> tuple[int, dict, list]:
    """The live CUDA-graph runners (sub-runners of other sizes included): how many, their summed counters
    (replays, plain_calls, recordings, invalidated), and why any turned graphs off."""
    from kiln.runtime.cudagraphs import CudaGraphRunner

    runners = [o for o in gc.get_objects() if isinstance(o, CudaGraphRunner)]
    totals = {field: sum(getattr(r, field) for r in runners)
              for field in ("replays", "plain_calls", "recordings", "invalidated")}
    return len(runners), totals, [r.disabled_reason for r in runners if r.disabled_reason]


def _check_cuda_graph_model(name, call, model, make, keep_results: bool) -> int:
    failures = 0
    policy = "invalidate" if keep_results else "default"
    torch._dynamo.reset()
    gc.collect()
    try:
        compiled = kiln.compile(model, mode="reduce-overhead")
        model64 = copy.deepcopy(model).double()
        out = None
        stale_message = "not checked"
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for step in range(6):
                args = [a.cuda() for a in make()]
                if not keep_results:
                    out = None  # released before the call
                out = call(compiled, *args)
                verdict = _compare(call, out, model, model64, args)
                if not verdict:
                    failures += 1
                    print(f"cudagraphs {policy:10} {name:10} call {step} MISMATCH {verdict.message}", flush=True)
            if keep_results:
                stale = out
                call(compiled, *[a.cuda() for a in make()])
                try:  # a result read after the next call raises, saying to keep a clone
                    stale.sum()
                    stale_message = "no error"
                except RuntimeError as error:
                    stale_message = "raises" if ".clone()" in str(error) else f"other error: {error}"
                del stale
            del out
        runners, totals, disabled = _runner_totals()
        failures += _report(f"cudagraphs {policy:10} {name:10} 6 calls checked; graphs {runners}, replays "
                            f"{totals['replays']}, plain calls {totals['plain_calls']}, disabled {disabled}, stale "
                            f"results invalidated {totals['invalidated']}, reading a stale result: {stale_message}",
                            not totals["replays"] or totals["plain_calls"] > 0
                            or (keep_results and stale_message != "raises"))
    except Exception:
        failures += 1
        print(f"cudagraphs {policy:10} {name:10} ERROR {traceback.format_exc()[-1500:]}", flush=True)
    return failures


def check_training_cuda_graphs(steps: int = 6) -> int:
    """Training steps under mode="reduce-overhead" (a small Llama, whose loss comes out of its forward; a small
    ResNet-18 in train mode, whose batch norms update their running statistics): at each step the compiled model's
    outputs (logits) and gradients against an eager copy's and a float64 copy's with the same parameters, then an
    SGD step; gradients set to None between steps, the loss of a step alive during the next (a user's loop). The
    losses are judged together, all steps' as one tensor: one bf16 loss is a single draw whose distance from
    float64's can be near zero for eager by chance (ResNet-18 at 5e2016d: kiln's per-step errors 0.11 to 4.5 times
    eager's, its logits and gradients within the rule at every step). The forward and the backward must replay, no
    call may run without its graph."""
    import transformers
    import torchvision

    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=512, vocab_size=1000)
    def llama_step(m, ids):
        out = m(input_ids=ids, labels=ids)
        return out.loss, out.logits

    def resnet_step(m, x):
        logits = m(x)
        return F.cross_entropy(logits.float(), torch.arange(4, device=x.device)), logits

    models = [("llama", transformers.LlamaForCausalLM(config), llama_step, lambda: (torch.randint(0, 1000, (2, 64)),)),
              ("resnet18", torchvision.models.resnet18(num_classes=10), resnet_step,
               lambda: (torch.randn(4, 3, 64, 64),))]
    failures = 0
    for name, model, loss_of, make in models:
        torch._dynamo.reset()
        gc.collect()
        try:
            model = model.cuda().train()
            eager, model64 = copy.deepcopy(model), copy.deepcopy(model).double()
            compiled = kiln.compile(model, mode="reduce-overhead")
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
            loss = None
            losses = []  # per step: kiln's, eager's and float64's losses
            for step in range(steps):
                args = [a.cuda() for a in make()]
                eager.load_state_dict(model.state_dict())
                model64.load_state_dict(model.state_dict())
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss, logits = loss_of(compiled, *args)  # the last step's loss alive during this call
                loss.backward()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    eager_loss, eager_logits = loss_of(eager, *args)
                eager_loss.backward()
                loss64, logits64 = loss_of(model64, *[a.double() if a.is_floating_point() else a for a in args])
                loss64.backward()
                losses.append([float(loss.detach()), float(eager_loss.detach()), float(loss64.detach())])
                # copies: a float32 .grad's .float() is the gradient itself, which kept alive into the next
                # step makes that backward run without its graph (a gradient kept to accumulate into), as it
                # did at 05ad837: 2 plain calls per model
                grads = [[p.grad.float().clone() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)
                          for p in m.parameters()] for m in (model, eager, model64)]
                for what, verdict in (("logits", kiln.testing.compare(logits.detach().float(),
                                                                      eager_logits.detach().float(), logits64.detach(),
                                                                      factor=3.0)),
                                      ("gradients", kiln.testing.compare(*grads, factor=3.0))):
                    if not verdict:
                        failures += 1
                        print(f"cudagraphs training  {name:10} step {step} {what} MISMATCH {verdict.message}",
                              flush=True)
                optimizer.step()
                for m in (eager, model64):
                    m.zero_grad(set_to_none=True)
            del loss
            mine, theirs, reference = torch.tensor(losses, dtype=torch.float64).unbind(1)
            verdict = kiln.testing.compare(mine.float(), theirs.float(), reference, factor=3.0)
            if not verdict:
                failures += 1
                print(f"cudagraphs training  {name:10} losses of all steps MISMATCH {verdict.message}", flush=True)
            runners, totals, disabled = _runner_totals()
            print(f"cudagraphs training  {name:10} loss errors vs float64 per step (kiln / eager): "
                  + ", ".join(f"{abs(a - c):.2e} / {abs(b - c):.2e}" for a, b, c in losses), flush=True)
            # the forward replays from its 2nd call on, the backward from its 3rd
            failures += _report(f"cudagraphs training  {name:10} {steps} steps checked; graphs {runners}, replays "
                                f"{totals['replays']} (at least {2 * steps - 3}), recordings {totals['recordings']}, "
                                f"plain calls {totals['plain_calls']}, disabled {disabled}",
                                totals["replays"] < 2 * steps - 3 or totals["plain_calls"] > 0 or bool(disabled))
        except Exception:
            failures += 1
            print(f"cudagraphs training  {name:10} ERROR {traceback.format_exc()[-1500:]}", flush=True)
    return failures


def check_default_mode_cuda_graphs() -> int:
    """The default mode's CUDA graphs (config.default_cuda_graphs, the "preserve" policy): an `out = model(x)`
    loop on the small Llama and ResNet that keeps every result (and a view of each), each checked against
    eager only after the later calls have replayed; the graphs must replay. Then the Llama at new sequence
    lengths (symbolic shapes: no graphs), checked."""
    failures = 0
    for name, call, model, make in _small_models():
        failures += _check_default_model(name, call, model, make)
    name, call, model, make = _small_models()[0]
    with kiln.config.patch(cuda_graph_tail_min_bytes=1):  # the small Llama's logits as a tail (off by default)
        failures += _check_default_model(f"{name} tail", call, model, make, tail=True)
    failures += _check_expanded_inputs()
    name, call, model, _ = _small_models()[0]
    torch._dynamo.reset()
    try:
        compiled = kiln.compile(model)
        model64 = copy.deepcopy(model).double()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for length in (64, 64, 64, 96, 96, 128):
                ids = torch.randint(0, 1000, (2, length), device="cuda")
                verdict = _compare(call, call(compiled, ids), model, model64, [ids])
                if not verdict:
                    failures += 1
                    print(f"default cudagraphs    {name:10} length {length} MISMATCH {verdict.message}", flush=True)
        print(f"default cudagraphs    {name:10} lengths 64, 96, 128 checked", flush=True)
    except Exception:
        failures += 1
        print(f"default cudagraphs    {name:10} sizes ERROR {traceback.format_exc()[-1500:]}", flush=True)
    return failures


def _check_default_model(name, call, model, make, tail: bool = False) -> int:
    """One model's `out = model(x)` loop under the default mode's CUDA graphs, every result (and a view of each)
    kept and checked against eager after the later calls have replayed. `tail`: the recording must be of the
    wrapper's head only, and the last output (the logits) made by its tail after each replay, never copied."""
    from kiln.runtime import cudagraphs

    torch._dynamo.reset()
    gc.collect()
    try:
        compiled = kiln.compile(model)
        model64 = copy.deepcopy(model).double()
        kept = []
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            out = None
            for _ in range(6):
                args = [a.cuda() for a in make()]
                out = call(compiled, *args)  # the previous `out` alive during the call
                kept.append((out, out[..., :3], args))
            del out
            verdicts = [_compare(call, out, model, model64, args) for out, _, args in kept]
            views_ok = all(torch.equal(view, out[..., :3]) for out, view, _ in kept)
        bad = [step for step, verdict in enumerate(verdicts) if not verdict]
        runners = [o for o in gc.get_objects() if isinstance(o, cudagraphs.CudaGraphRunner) and o.preserve]
        replays = sum(r.replays for r in runners)
        disabled = [r.disabled_reason for r in runners if r.disabled_reason]
        fresh = sum(kind == "fresh" for r in runners if r.split is not None for kind, _ in r.outputs)
        split_note = f", tail outputs {fresh}" if tail else ""
        failed = bool(bad) or not views_ok or not replays or bool(disabled) or (tail and not fresh)
        result = _report(f"default cudagraphs    {name:10} 6 results kept and checked after later calls: "
                         f"{'ok' if not bad and views_ok else f'MISMATCH at calls {bad}, views ok {views_ok}'}; "
                         f"graphs {len(runners)}, replays {replays}, disabled {disabled}{split_note}", failed)
        del kept
        return result
    except Exception:
        print(f"default cudagraphs    {name:10} ERROR {traceback.format_exc()[-1500:]}", flush=True)
        return 1


class _Masked(torch.nn.Module):
    """An MLP whose input is scaled by a mask the caller expands (a stride-0 dim, a new tensor each call)."""

    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 128),
                                       torch.nn.GELU(), torch.nn.Linear(128, 64))

    def forward(self, x, mask):
        return self.mlp(x * mask)


def _check_expanded_inputs() -> int:
    """An expanded input, new each call, in the default mode and reduce-overhead: every call vs eager, and the
    graphs replay (the recording once raised copying it into its buffer)."""
    from kiln.runtime import cudagraphs

    failures = 0
    model = _Masked().cuda().eval()
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        gc.collect()
        try:
            compiled = kiln.compile(model, mode=mode)
            bad = 0
            with torch.no_grad():
                for _ in range(5):
                    x = torch.randn(32, 64, device="cuda")
                    mask = torch.randn(64, device="cuda").expand(32, 64)
                    got, want = compiled(x, mask).clone(), model(x, mask)
                    bad += not kiln.testing.compare(got, want)
            runners = [o for o in gc.get_objects() if isinstance(o, cudagraphs.CudaGraphRunner)]
            replays = sum(r.replays for r in runners)
            failures += _report(f"expanded input        {mode:16} 5 calls: {'ok' if not bad else f'{bad} MISMATCH'}; "
                                f"graphs {len(runners)}, replays {replays}", bool(bad) or not replays)
        except Exception:
            failures += 1
            print(f"expanded input        {mode:16} ERROR {traceback.format_exc()[-1500:]}", flush=True)
    return failures


def check_max_autotune() -> int:
    """The max-autotune modes on Linear-GELU-Linear (bf16, BERT's FFN sizes): correct on new inputs each
    call, and something was timed (autotuning's records in a fresh cache directory)."""
    import pathlib
    import tempfile

    failures = 0
    model = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768))
    model = model.cuda().to(torch.bfloat16).eval()
    model64 = copy.deepcopy(model).double()
    for mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        try:
            with tempfile.TemporaryDirectory() as cache_dir, kiln.config.patch(cache_dir=cache_dir), torch.no_grad():
                compiled = kiln.compile(model, mode=mode)
                for step in range(3):
                    x = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16)
                    verdict = kiln.testing.compare(compiled(x).clone(), model(x), model64(x.double()))
                    failures += not verdict
                    if not verdict:
                        print(f"{mode:28} call {step} MISMATCH {verdict.message}", flush=True)
                choices = len(list(pathlib.Path(cache_dir).rglob("autotune/*.json")))
            failures += _report(f"{mode:28} 3 calls checked; autotuned choices {choices}", choices == 0)
        except Exception:
            failures += 1
            print(f"{mode:28} ERROR {traceback.format_exc()[-1500:]}", flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(main())
