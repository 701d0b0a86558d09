"""kiln's one registry of options.

Every knob is an `Option` here: a name, a type, a default and a one-line meaning.
Each reads its environment variable `KILN_<NAME>` once at import, can be set as an
attribute (`kiln.config.strict = True`) and patched for a block:

    with kiln.config.patch(strict=True, debug=True):
        ...

No other module reads `os.environ` for kiln options.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

# KILN_LOGS topics: each turns on one focused log (logging.getLogger("kiln")).
LOG_TOPICS = ("graph_breaks", "recompiles", "guards", "kernels", "perf")


def _log_topics(value: str) -> str:
    """`value` as a comma-separated list of known topics (spaces and empty items dropped), or ValueError."""
    topics = [topic.strip() for topic in value.split(",") if topic.strip()]
    unknown = [topic for topic in topics if topic not in LOG_TOPICS]
    if unknown:
        raise ValueError(f"unknown log topic(s) {', '.join(map(repr, unknown))}; "
                         f"valid topics: {', '.join(LOG_TOPICS)} (comma-separated)")
    return ",".join(topics)


def _one_of(*choices: str) -> Callable[[str], str]:
    """A normalizer accepting exactly `choices` (ValueError listing them otherwise)."""
    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"unknown value {value!r}; choose one of {', '.join(map(repr, choices))}")
        return value
    return check


def _index_checks(value: str) -> str:
    """gpu_index_checks: one of its three values; the boolean spellings it once took still work."""
    value = {"1": "sync", "true": "sync", "0": "off", "false": "off", "no": "off"}.get(str(value).lower(), value)
    return _one_of("deferred", "sync", "off")(value)


@dataclass(frozen=True)
class Option:
    name: str
    type: type
    default: Any
    help: str
    normalize: Callable[[Any], Any] | None = None  # checks a value (ValueError saying what is valid), returns it normalized

    @property
    def env_var(self) -> str:
        return "KILN_" + self.name.upper()

    def parse(self, text: str) -> Any:
        if self.type is bool:
            return text.strip().lower() not in ("", "0", "false", "no", "off")
        return self.type(text)

    def check(self, value: Any, *, check_type: bool = True) -> Any:
        """`value` if this option accepts it (normalized), else TypeError or ValueError saying what it takes.
        check_type=False (setting `kiln.config.<name>`) checks only what `normalize` checks."""
        accepted = {float: (int, float), str: (str, os.PathLike)}.get(self.type, (self.type,))
        if check_type and (not (isinstance(value, accepted) or (value is None and self.default is None))
                           or (isinstance(value, bool) and self.type is not bool)):
            raise TypeError(f"kiln.config.{self.name} takes a {self.type.__name__}"
                            f"{' or None' if self.default is None else ''}, got {value!r}")
        if self.normalize is not None and value is not None:
            try:
                value = self.normalize(value)
            except ValueError as error:
                raise ValueError(f"kiln.config.{self.name} ({self.env_var}): {error}") from None
        return value


OPTIONS = [
    Option("strict", bool, False, "raise on any compile failure instead of running the graph eagerly"),
    Option("debug", bool, False, "dump every stage of every graph under debug_dir"),
    Option("debug_dir", str, "kiln_debug", "where KILN_DEBUG dumps go"),
    Option("report", str, "", "write one browsable HTML page of everything kiln compiled in this process into this "
                               "folder at exit (kiln/debug/html_report.py, `kiln report`); empty: off"),
    Option("logs", str, "", "comma-separated focused logs: " + ",".join(LOG_TOPICS), normalize=_log_topics),
    Option("cache_dir", str, os.path.join(os.path.expanduser("~"), ".cache", "kiln"),
           "on-disk cache of generated kernels"),
    Option("graph_cache", bool, True, "keep each compiled graph's generated module in cache_dir, so that a new "
                                      "process compiling the same graph skips lowering and codegen "
                                      "(kiln/runtime/graph_cache.py)"),
    Option("cpu_backend", str, "cpp", "kernels for CPU tensors: 'cpp' (C++/OpenMP, kiln/codegen/cpp.py) "
                                      "or 'triton' (the same Triton kernels under Triton's interpreter)"),
    Option("cpp_compiler", str, "", "C++ compiler for CPU kernels; empty: the first of g++, c++, clang++ on PATH"),
    Option("cpp_openmp", bool, True, "C++ kernels run their outer loops on OpenMP threads (when the compiler has it)"),
    Option("cpp_parallel_min", int, 32768, "C++ kernels over fewer elements than this run on one thread"),
    Option("cpu_scratch_arena", bool, True, "a compiled CPU graph's intermediates live in one block, allocated at its "
                                            "first call and reused by later calls (kiln/runtime/scratch.py)"),
    Option("cuda_scratch_arena", bool, False, "a compiled CUDA inference graph's intermediates live in one block, kept "
                                              "between calls, instead of one caching-allocator call each (off until "
                                              "an H200 run shows the host time it saves)"),
    Option("cpu_huge_pages_min_bytes", int, 32 << 20, "CPU buffers kiln allocates of at least this size ask for "
                                                       "transparent huge pages, when their memory is untouched (kiln/runtime/host_memory.py); 0: never"),
    Option("cpu_gemm", str, "onednn", "fp32 CPU products of nn.Linear's layout: 'onednn' (oneDNN's linear, "
                                      "kiln/lowering/matmul.py) or 'aten' (aten.mm/addmm, MKL's sgemm)"),
    Option("cpu_gemm_post_ops", bool, True, "... and a product's only elementwise consumer (gelu, silu, "
                                            "* tensor; kiln/lowering/patterns.py) is applied by oneDNN as it "
                                            "stores the product"),
    Option("compile_workers", int, 0, "kernels compiled at once (0: one per CPU core)"),
    Option("compile_processes", bool, True, "compile_ahead's threads have worker processes compile each CUDA "
           "kernel into Triton's cache first, past the GIL (kiln/runtime/compile_workers.py); off: the threads "
           "compile in this process"),
    Option("compile_worker_warm_up", bool, False, "each compile worker process first compiles a throwaway kernel "
           "for the current GPU, at a lower priority than this process (kiln/runtime/compile_worker_main.py warm_up), "
           "while this process traces: a process's first Triton compile costs 0.35-0.4 s more than a later one on "
           "the CPU machine; off until a GPU has measured it"),
    Option("compile_gc_freeze", bool, True, "while kiln compiles, the objects alive before are kept out of the "
           "garbage collector's scans (gc.freeze, undone when the compile ends: kiln/runtime/heap.py), so the "
           "collections a compile's allocations trigger do not walk the whole heap"),
    Option("progress_after_s", float, 5.0, "a compile step running longer than this reports how many kernels are "
           "done, of how many (on kiln's logger); negative: never"),
    Option("progress_every_s", float, 5.0, "... and again at most this often"),
    Option("partitioner", str, "min_cut", "what a training graph's forward saves for its backward: 'default' (every "
           "value the backward needs) or 'min_cut' (fewer bytes: cheap pointwise work recomputed in the backward, "
           "as Inductor does)", normalize=_one_of("default", "min_cut")),
    Option("conv_layout", str, "auto", "the layout of an inference graph's 2-D convolutions (kiln/aot/layouts.py): "
           "'auto' (the default: channels_last on CUDA), 'channels_last' (NHWC, which cuDNN's fastest kernels take; "
           "values around the convs follow it, the graph's outputs keep their layouts), 'keep' (the traced layouts)",
           normalize=_one_of("auto", "channels_last", "keep")),
    Option("conv_layout_training", bool, True, "training graphs' 2-D convolutions take channels-last operands too, "
           "where conv_layout says so (kiln/aot/layouts.py channels_last_training_convs: before AOTAutograd's joint "
           "trace); on: ResNet-50 b64 training 17.58 ms a step against NCHW's 21.07 (H100, 283666d)"),
    Option("dense_attention_inputs", str, "all", "which CUDA SDPA calls get their strided inputs (a broadcast "
           "attention mask) copied dense before tracing, so the trace picks a fused attention kernel over the math "
           "path, which upcasts 16-bit operands to float32 (kiln/aot/attention.py): 'all', 'training' (calls with "
           "a gradient), 'off'",
           normalize=_one_of("training", "all", "off")),
    Option("causal_attention_masks", bool, True, "an SDPA mask that depends on no input and is exactly the causal "
           "pattern (or masks nothing) is dropped at compile time, the call made is_causal=True, so flash attention "
           "can run (kiln/aot/attention.py causal_masks)"),
    Option("in_kernel_dropout", bool, True, "dropout's mask drawn in kiln's kernels from a Philox seed, and "
           "recomputed in the backward from the seed rather than saved (kiln/aot/random.py)"),
    Option("ddp_split", bool, True, "a graph traced inside DistributedDataParallel's forward is compiled as one piece "
           "per gradient bucket, so each bucket's all-reduce overlaps the rest of the backward (kiln/frontend/ddp.py); "
           "off: one graph, whose gradients are all ready at the end of its backward"),
    Option("plain_trace", bool, True, "a plain inference graph (no autograd, no in-place writes, no aliased outputs: "
           "kiln/aot/plain.py) is traced to ATen once, without AOTAutograd, which traces it twice; off: AOTAutograd"),
    Option("parallel_compile", bool, True, "a graph's CUDA kernels are compiled in parallel when it loads, before "
           "their first launch (kiln/runtime/launch.py compile_ahead); off: each compiles at its first launch"),
    Option("compile_overlap", bool, True, "... and the graph's first call starts while they compile, each kernel's "
           "first launch waiting for its own compile only (kiln/runtime/launch.py compile_ahead); off: the graph "
           "waits for all of them before its first call"),
    Option("default_cuda_graphs", bool, True, "mode='default': a CUDA inference graph of static shapes replays "
           "through a CUDA graph from its third call (kiln/runtime/cudagraphs.py), its results as fresh as eager's: "
           "each call's results are copies of the graph's output buffers"),
    Option("cuda_graph_tail_min_bytes", int, 0, "mode='default': a graph's last steps, when each makes graph "
           "outputs of at least this many bytes (an LM head's logits), run after its CUDA graph's replay rather than "
           "inside it, into fresh memory, so those outputs are never copied out of the graph's pool "
           "(kiln/codegen/wrapper.py call_tail; 0, the default until a GPU has run it: never; 16777216 is the "
           "setting to measure)"),
    Option("cudagraph_invalidate", bool, True, "mode='reduce-overhead': a result still referenced at the next call is "
           "invalidated (reading it raises, saying to keep a .clone()) and the graph replays, as torch.compile's "
           "do; off: such a call runs without its graph"),
    Option("cudagraph_max_shapes", int, 8, "mode='reduce-overhead': recordings of one graph for different sizes "
           "(each with its own memory); calls with sizes past that run without graphs"),
    Option("fast_launch", bool, True, "CUDA kernels launched by kiln's launcher (kiln/runtime/launch.py), "
                                      "not through Triton's per-call specialization"),
    Option("fusion_window", int, 6, "a node may join a kernel up to this many steps back (not only the last)"),
    Option("max_fusion_ops", int, 400, "largest body (in ops) a fused kernel may grow to"),
    Option("inline_max_ops", int, 40, "a pointwise producer read by several consumers is inlined "
                                      "into each when its body has at most this many ops"),
    Option("inline_max_reads", int, 3, "... and reads at most this many distinct buffers"),
    Option("split_reduction_max_rows", int, 32, "reductions with at most this many rows are split in two stages..."),
    Option("split_reduction_min_columns", int, 8192, "... when a row has at least this many columns"),
    Option("split_reduction_target_programs", int, 256, "... into chunks so that rows x chunks is about this"),
    Option("split_long_row_programs", int, 1024, "a reduction of fewer rows than this whose rows are longer than "
           "persistent_reduction_max (an NCHW batch norm's statistics: 64 channels of 802,816 at ResNet-50's stem, "
           "batch 64) is split even where its consumer reads the rows again (that kernel would loop over each row "
           "twice anyway), into chunks so that rows x chunks is about this (0: never)"),
    Option("split_long_row_min_columns", int, 32768, "... when its rows have at least this many columns (one program "
           "streaming a shorter row takes about a launch's time: a softmax of 4 x 9000 stays one kernel)"),
    Option("split_outer_target_programs", int, 1024, "an outer reduction (kiln/schedule/outer.py) is split into "
           "chunks so that its row tiles x chunks is about this: 8 programs of 64 x 32 per SM of an H200"),
    Option("matmul_template", str, "default",
           "2-d products on the Triton backends (kiln/lowering/matmul.py, kiln/runtime/autotune.py): 'auto' (a "
           "Triton template, which a pointwise epilogue joins, where it times faster than cuBLAS plus one pass "
           "over the product; CUDA only, the tile autotuned and cached), 'on' (always the template, the default "
           "tile), 'off' (always the ATen extern), 'default' ('auto' under the max-autotune modes; otherwise the extern, except CUDA 2-d products of "
           "16-bit operands whose n is not a multiple of 8, where cuBLAS is slow: the template's default tile)",
           normalize=_one_of("default", "off", "on", "auto")),
    Option("autotune_kernels", str, "default",
           "CUDA pointwise and reduction kernels with static sizes (kiln/codegen/tuning.py): 'auto' (a few block "
           "sizes and warp counts timed per kernel, the fastest kept and cached), 'off' (the heuristic config), "
           "'default' (as matmul_template's)", normalize=_one_of("default", "off", "auto")),
    Option("autotune_budget_s", float, 60.0, "autotuning: the most seconds one graph spends compiling and timing "
           "candidates; past it, the remaining products take the extern"),
    Option("persistent_reduction_max", int, 8192, "rows up to this length stay in registers"),
    Option("welford_compensation", bool, True, "a looped welford's per-lane mean and m2 each carry Kahan's "
           "compensation (kiln/codegen/triton.py), as long rows need to stay as accurate as eager's; off: plain "
           "Welford updates, fewer instructions an element (benchmarks/outer_reduction_probe.py weighs the two)"),
    Option("gpu_index_checks", str, "deferred",
           "how a graph whose Triton kernels gather (index, gather, embedding) learns of an out-of-range index "
           "on CUDA: 'deferred' raises IndexError at the graph's next call, with no host sync; 'sync' raises in "
           "the call itself (one host sync per call); 'off' never (such an index reads element 0, silently)",
           normalize=_index_checks),
    Option("verify_ir", bool, None, "check LoopIR (ir.verify) and the scheduled form (schedule.verify_scheduled) at "
                                    "every stage boundary of compile_graph; unset: on exactly when strict is"),
    Option("check_extern_strides", bool, True, "re-stride an extern's output when it differs from its meta"),
    Option("graph_breaks", bool, True, "kiln's frontend compiles the code around a call or branch it cannot trace "
                                       "and runs only that in Python (kiln/frontend/resume.py); off: such a "
                                       "frame runs eagerly whole"),
    Option("frontend", str, "kiln", "graph capture for kiln.compile: 'kiln' (kiln/frontend, bytecode capture) "
                                     "or 'dynamo' (TorchDynamo)"),
]

_BY_NAME = {option.name: option for option in OPTIONS}


class _Config:
    """Attribute access to the registry's current values."""

    def __init__(self) -> None:
        values = {}
        for option in OPTIONS:
            text = os.environ.get(option.env_var)
            values[option.name] = option.default if text is None else option.check(option.parse(text))
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"kiln.config has no option {name!r}; options: {sorted(_BY_NAME)}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _BY_NAME:
            raise AttributeError(f"kiln.config has no option {name!r}; options: {sorted(_BY_NAME)}")
        self._values[name] = _BY_NAME[name].check(value, check_type=False)

    def checked(self, options: dict) -> dict:
        """`options` (name -> value, as `kiln.compile(options=...)` takes them) checked and normalized:
        an unknown name raises listing the valid ones, a wrong value says what the option takes."""
        if not isinstance(options, dict):
            raise TypeError(f"kiln: options must be a dict of kiln.config options, got {type(options).__name__}")
        unknown = sorted(name for name in options if name not in _BY_NAME)
        if unknown:
            raise ValueError(f"kiln: unknown option(s) {', '.join(map(repr, unknown))}; valid options: "
                             f"{', '.join(sorted(_BY_NAME))} (kiln.config.describe() says what each does)")
        return {name: _BY_NAME[name].check(value) for name, value in options.items()}

    @contextlib.contextmanager
    def patch(self, **changes: Any) -> Iterator[None]:
        old = {name: getattr(self, name) for name in changes}
        try:
            for name, value in changes.items():
                setattr(self, name, value)
            yield
        finally:
            self._values.update(old)

    def snapshot(self) -> dict:
        """The values that change generated code (part of cache keys)."""
        return dict(self._values)

    def log_enabled(self, topic: str) -> bool:
        return topic in self._values["logs"].split(",")

    def describe(self) -> str:
        return "\n".join(f"{o.env_var:32} {self._values[o.name]!r:12} {o.help}" for o in OPTIONS)


config = _Config()
