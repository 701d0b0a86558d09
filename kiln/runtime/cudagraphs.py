"""CUDA graphs for `mode="reduce-overhead"`: record a compiled graph once, replay it.

kiln's generated wrapper issues one kernel launch or extern call per step from Python; a
transformer layer stack is hundreds of steps, and on a GPU the host then takes longer to
issue the work than the GPU takes to do it. A CUDA graph records the launches once and
replays them with one call.

How one compiled graph is used (`CudaGraphRunner`):
1. first call: the wrapper runs normally, on a side stream (lazy initializations, cuBLAS
   workspaces and Triton's kernel loads happen outside any capture);
2. second call: parameters, and other inputs still at the address they had in the first
   call (buffers, caches), are read in place; every other input is copied into a buffer
   kiln owns. The wrapper is captured into a graph with its own memory pool, then
   replayed for this call's results;
3. later calls: check that each in-place input is still where it was, copy the others in,
   replay, and return fresh aliases of the graph's output buffers.

Correctness first. A replay writes its results into the same memory as the previous one, so
a result of the previous call that is still referenced must never show the new values. Two
policies, chosen by `config.cudagraph_invalidate`:
- on (the default; torch.compile's semantics): a result is valid until the next call.
  Each call's results sit on storage objects of their own over the graph's output buffers
  (`_torch.storage_alias`), weakly referenced by the runner; before a replay, the previous
  results still referenced are invalidated (`_torch.storage_invalidator`), so reading one raises
  an error that says to keep a `.clone()`, and the graph replays. A result of the previous call
  fed back as an input of this one still runs the call without the graph, and so does a torch
  build without the invalidation (CPU-only builds: the use-count check). Dropping a recording
  (to record again) or the runner invalidates the results still referenced, since their memory
  goes with it.
- off: before a replay the runner checks the output storages' use counts; if a tensor or view
  of the previous results is alive, that call runs the wrapper without the graph (correct,
  slower; logged once). In an `out = model(x)` loop `out` is alive during the next call, so
  such a loop runs without the graph.
A training step's two graphs (AOTAutograd's partition, tagged by kiln/aot `training_role`) are recorded
too. The forward's outputs are the user's, then the tensors (and sizes) saved for the backward, from
position `saved_from` on; the user's follow the policy above, but a saved tensor is never invalidated:
it must stay valid until its backward runs. So one of the previous replay's saved tensors still alive at
the next call (its backward has not run: two forwards before one backward, or `retain_graph=True`) makes
that call run without the graph (logged once), and keeps the recording even where an input moved. The
backward's results, gradients, are all treated so (`block_results`): a `.grad` kept to accumulate into
blocks the replay; with `zero_grad(set_to_none=True)` between steps it replays. The backward's inputs are
the forward's saved tensors, then the incoming gradients; the saved ones come from the forward's graph only
once the forward has recorded (at its second call), so the backward warms up twice (`warm_up_calls`),
takes its second call's addresses, and records at its third: the saved tensors, at the same addresses in
each forward replay, are then read in place, never copied (a copy of each activation a step would double
their memory). AOTAutograd releases the saved tensors when the backward runs (without `retain_graph`); the
backward then consumes its argument list. Without the invalidation (off, or a CPU-only build) every
result alive blocks the replay anyway. Where memory goes with a recording (recording again, dropping the
runner), the saved tensors and gradients still alive are invalidated too.
An in-place input that moved makes the runner record again, up to `MAX_RECORDINGS` times: a
parameter is read in place again (reassigned weights), any other input is copied in from then
on (an activation that the allocator happened to place at the same address twice); a capture
that fails (a host synchronization, a CPU tensor) makes calls run without the graph, with the
reason logged. A shape-generic graph takes its sizes as non-tensor inputs: each new tuple of
them gets a runner (and a recording, with its own memory) of its own, up to
`config.cudagraph_max_shapes` recordings (8 by default; calls with sizes past that run without graphs).

In the default mode (`config.default_cuda_graphs`), a third policy, "preserve", keeps eager's
semantics: every result stays valid. A CUDA inference graph of static shapes (every input a CUDA
tensor) is recorded as above, and each replay's results are copies of the graph's output buffers
(one copy per buffer, so results that share memory still do), made on the same stream right after
the replay: in an `out = model(x)` loop, one copy of the outputs per call in place of the hundreds
of launches the host would issue. (torch 2.11 has no way to move a storage that a result still
holds, `UntypedStorage._swap_data_ptr_`, which would let a copy be made only for results still
referenced at the next replay.) Since no result is ever on a graph's memory, all such graphs on a
device share one memory pool and one stream (`PreservingPool`): graph breaks do not multiply
memory. A parameter that moved, or a recording that failed (a host sync, a CPU tensor), turns the
graph off (logged at INFO); calls made while the caller records a CUDA graph of its own run
without it. Eager's calls are safe from any thread and stream, and a graph's static buffers are
shared, so: a pool belongs to one thread (the thread that compiled; a call from another runs
without the graph), and a replay on another stream than the pool's last one first waits for it
(the previous replay may still be reading the static inputs this call overwrites, or its results
may not yet be copied out of buffers this replay writes).

`capture` is a parameter so that tests can drive the same logic on a CPU with a
stand-in recording (tests/runtime/test_cudagraphs.py, test_cudagraphs_training.py); on a GPU it is `cuda_capture`.
"""
from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Callable

import torch

from kiln import _torch

log = logging.getLogger("kiln")

MAX_RECORDINGS = 3

STALE_RESULT = ("kiln: this tensor is a result of graph {name} under mode='reduce-overhead', and a later call "
                "overwrote its memory (CUDA graph results are valid until the next call). Keep a .clone() of a "
                "result you need after the next call.")
FREED_RESULT = ("kiln: this tensor is a result of graph {name} under mode='reduce-overhead' (saved for the backward, "
                "or a gradient), and its memory went with the graph's recording (recorded again, or the compiled "
                "function was dropped). Keep a .clone() of a result you need after that.")


class CudaCapture:
    """One recorded CUDA graph: `replay()` reruns the launches `run` issued while recording. `pool`: the
    memory pool to record into (None: one of its own). Only this thread's CUDA calls are checked while it
    records ("thread_local"): a user's other threads (a data loader pinning memory) may go on."""

    def __init__(self, run: Callable[[], list], stream, pool=None) -> None:
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            self.outputs = run()

    def replay(self) -> None:
        self.graph.replay()


def cuda_capture(run: Callable[[], list], stream, pool=None) -> CudaCapture:
    return CudaCapture(run, stream, pool)


class PreservingPool:
    """What the default mode's CUDA graphs on one device, called from one thread, share: a memory pool to record
    into, a stream to warm up and record on, and the stream of the last replay. Sharing is safe because their
    results are copies, made on the replay's stream: a replay may overwrite any buffer of the pool (another
    graph's outputs included) once it is ordered after the last replay (`order`)."""

    def __init__(self, pool=None, stream=None, thread: int | None = None,
                 current_stream: Callable | None = None) -> None:
        self.pool, self.stream = pool, stream
        self.thread = thread if thread is not None else threading.get_ident()
        self._current_stream = current_stream or torch.cuda.current_stream
        self._last_stream = None

    def order(self) -> None:
        """Before a replay (or the copies into its static inputs): the current stream waits for the last
        replay's, where they differ."""
        stream = self._current_stream()
        if self._last_stream is not None and stream != self._last_stream:
            stream.wait_stream(self._last_stream)
        self._last_stream = stream


_preserving_pools: dict = {}  # (CUDA device index, thread) -> their PreservingPool


def preserving_pool(device: torch.device) -> PreservingPool:
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, threading.get_ident())
    found = _preserving_pools.get(key)
    if found is None:
        with torch.cuda.device(index):
            found = _preserving_pools[key] = PreservingPool(torch.cuda.graph_pool_handle(), torch.cuda.Stream())
    return found


_side_streams: dict = {}  # (CUDA device index, thread) -> the stream its runners warm up and record on


def side_stream():
    """The stream for warm-up runs and captures (one per device and thread, shared by the runners, as the
    default mode's PreservingPool shares its stream), ordered after the current one. One stream, not one per
    call: torch keeps a cuBLAS workspace (32 MiB on an H100) for each stream a product ran on."""
    key = (torch.cuda.current_device(), threading.get_ident())
    stream = _side_streams.get(key)
    if stream is None:
        stream = _side_streams[key] = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    return stream


class CudaGraphRunner:
    """A boxed compiled graph (`runner(list_of_inputs) -> outputs`) replayed through a CUDA graph."""

    _boxed_call = True

    def __init__(self, compiled, name: str, *, capture: Callable = cuda_capture,
                 make_stream: Callable = side_stream, stream_context: Callable = torch.cuda.stream,
                 invalidate: Callable | None | str = "config", max_shapes: int | None = None,
                 preserve: PreservingPool | None = None, is_capturing: Callable | None = None,
                 release_workspaces: Callable | None | str = "torch", saved_from: int | None = None,
                 block_results: bool = False, warm_up_calls: int = 1, fresh: tuple = (),
                 mutated: tuple = ()) -> None:
        """`saved_from`: a training forward, whose results from this position on are saved for its backward;
        `block_results`: a backward, whose results are gradients. Such results are never invalidated: one of the
        last replay still alive makes the next call run without the graph (module docstring). `warm_up_calls`:
        calls run without the graph before the one that records; the last one's input addresses decide which
        inputs are read in place (a backward's: 2, so that they are the forward's recorded ones). `fresh`: the
        positions of inputs new on every call (a backward's tangents), always copied in: one whose address
        happened to repeat between the last warm-up and the recording was read in place, and its next move
        cost a warm-up and a recording more (Llama's training in benchmarks/gpu_smoke.py, 8 replays of 9).
        `mutated`: the positions of inputs the graph writes (kiln/aot/mutations.py: a batch norm's running
        statistics), always read in place: written in a copy of kiln's, a replay's write would never reach them.
        One that moved makes the runner record again, as a parameter that moved does."""
        from kiln.config import config

        # torch's cuBLAS workspaces are kept per stream for the process's life: one first made by the warm-up
        # would stay allocated outside any graph, and one made while recording would stay allocated in the
        # graph's pool, for as long as the runner lives. Released before and after each (torch's CUDA-graph
        # trees do the same); a product run later makes its workspace again, a replay uses the recorded one.
        self._release_workspaces = (_torch.cublas_workspace_releaser() if release_workspaces == "torch"
                                    else release_workspaces)

        if invalidate == "config":  # torch's invalidation when config.cudagraph_invalidate, else the use-count check
            invalidate = _torch.storage_invalidator() if config.cudagraph_invalidate and preserve is None else None
        # The default mode's policy: results stay valid (each replay's are copies); the device's shared pool
        # is recorded into, and its stream warms up and records.
        self.preserve = preserve
        self._caller_is_capturing = is_capturing or torch.cuda.is_current_stream_capturing
        if preserve is not None:
            stream = preserve.stream
            make_stream = lambda: _ordered(stream)  # noqa: E731
        self.max_shapes = max_shapes if max_shapes is not None else config.cudagraph_max_shapes
        self.compiled = compiled
        self.name = name
        # Other sizes: a shape-generic graph gets its sizes as non-tensor inputs; each new tuple of them
        # has a runner of its own (recorded on its second call), up to max_shapes; past that, calls with
        # new sizes run without graphs.
        self._options = dict(capture=capture, make_stream=make_stream, stream_context=stream_context,
                             invalidate=invalidate, max_shapes=self.max_shapes, preserve=preserve,
                             release_workspaces=self._release_workspaces, saved_from=saved_from,
                             block_results=block_results, warm_up_calls=warm_up_calls, fresh=fresh,
                             mutated=mutated)
        self._scalar_positions: tuple | None = None  # where the non-tensor inputs are
        self._key = None  # their values in this runner's calls
        self.shapes: dict = {}  # other values -> their runner
        self._capture, self._make_stream, self._stream_context = capture, make_stream, stream_context
        self._invalidate = invalidate  # None: a result still referenced blocks the replay instead
        self._message = STALE_RESULT.format(name=name)
        self._previous: list = []  # weak references to the storages of the last replay's results
        self.invalidated = 0  # results invalidated, over the runner's life
        weakref.finalize(self, _invalidate_alive, self._previous, invalidate, self._message)
        # The results never invalidated: from this output position on (None: none), weakly referenced in `_held`
        # (storages of their own, apart from those of the results invalidated, even over the same buffer).
        self.saved_from, self.block_results = saved_from, block_results
        self._held_from = 0 if block_results else saved_from
        self._held_reason = ("a gradient of the previous call is still referenced (kept to accumulate into; its "
                             "memory would be overwritten)" if block_results else
                             "the previous call's saved tensors are still held because its backward has not run "
                             "(two forwards before one backward, or retain_graph=True; their memory would be "
                             "overwritten)")
        self._held_advice = ("Set gradients to None between steps (optimizer.zero_grad(set_to_none=True)) to replay "
                             "it" if block_results else "Run each forward's backward before the next forward to "
                             "replay it")
        self._freed_message = FREED_RESULT.format(name=name)
        self._held: list = []  # weak references to the storages of the last replay's results never invalidated
        weakref.finalize(self, _invalidate_alive, self._held, invalidate, self._freed_message)
        self.warm_up_calls = warm_up_calls
        self.kernel_count = getattr(compiled, "kernel_count", 0)
        self.extern_count = getattr(compiled, "extern_count", 0)
        self.module_source = getattr(compiled, "module_source", None)
        self.recordings = 0
        self.mutated = frozenset(mutated)  # positions of inputs the graph writes: read in place, never copied
        self.moved: set = set(fresh) - self.mutated  # positions of other inputs that moved (or always do): copied in
        self.disabled_reason: str | None = None
        self.replays = 0
        self.plain_calls = 0
        self._reset()

    def _reset(self) -> None:
        if getattr(self, "recording", None) is not None:  # its memory goes: the results on it too
            self.invalidated += _invalidate_alive(self._previous, self._invalidate, self._message)
            self.invalidated += _invalidate_alive(self._held, self._invalidate, self._freed_message)
        self.recording = None
        self.split = None  # the compiled graph's Split when the recording is of its head only (preserve policy)
        self.warm_ups = 0  # calls run to warm up since the last recording went
        self.first_call: list | None = None  # per input, in the last warm-up: data_ptr of a tensor, or the value
        self.in_place: list = []  # (position, data_ptr) read where they are
        self.copied: list = []  # (position, static buffer) copied into before each replay
        self.broadcast: set = set()  # positions of copied inputs with broadcast dims (stride 0): copied as _held_part
        self.constants: list = []  # (position, value) non-tensor inputs the recording assumed
        self.outputs: list = []  # per output: ("pool", tensor) | ("input", tensor) | ("clone", tensor) | ("value", v)
        #                          | ("fresh", None): made by the split's tail, after the replay, in memory of its own
        self.storages: list = []  # (storage handle, use count when no result is alive)

    # ---- calling ---------------------------------------------------------------------------------
    def __call__(self, args: list):
        if self._scalar_positions is None:
            self._scalar_positions = tuple(position for position, value in enumerate(args)
                                           if not isinstance(value, torch.Tensor))
            self._key = tuple(args[position] for position in self._scalar_positions)
        elif self._scalar_positions:
            key = tuple(args[position] for position in self._scalar_positions)
            if key != self._key:
                return self._other_shape(key, args)
        if self.disabled_reason is not None:
            return self._plain(args)
        if self.preserve is not None and (self._caller_is_capturing() or threading.get_ident() != self.preserve.thread):
            return self._plain(args)  # the caller records a CUDA graph of its own (the wrapper's launches join it),
            #                           or calls from another thread than the pool's (whose static buffers are shared)
        if self.recording is None:
            if self.warm_ups < self.warm_up_calls:
                return self._warm_up(args)
            return self._record(args)
        if self._invalidate is not None and any(not ref.expired() for ref in self._held):
            # before an input that moved is looked at: recording again would free the memory they are on
            self._note_plain(self._held_reason, self._held_advice)
            return self._plain(args)
        reason = self._replay_blocker(args)
        if reason == "moved" and self.preserve is not None:
            moved = [position for position, address in self.in_place if args[position].data_ptr() != address]
            if any(isinstance(args[position], torch.nn.Parameter) for position in moved):
                self._reset()
                return self._disable(f"parameters moved (inputs {moved}): reassigned, or one graph serving "
                                     f"several modules", args)
        if reason == "moved":  # warm up and record again, with the new addresses
            self.moved |= {position for position, address in self.in_place
                           if args[position].data_ptr() != address and not isinstance(args[position], torch.nn.Parameter)
                           and position not in self.mutated}
            self._reset()
            return self._warm_up(args)
        if reason is not None:
            self._note_plain(reason)
            return self._plain(args)
        if self.preserve is not None:
            self.preserve.order()
        for position, static in self.copied:
            if position in self.broadcast:
                _held_part(static).copy_(_held_part(args[position]))
            else:
                static.copy_(args[position])
        if self._invalidate is not None:
            self.invalidated += _invalidate_alive(self._previous, self._invalidate, self._message)
        self.recording.replay()
        self.replays += 1
        self._check_indices()
        args.clear()
        return self._results(self._run_tail())

    def _run_tail(self) -> list | None:
        """After a replay of a split graph's head: its tail, run on the head's recorded values (on the same stream,
        so before the next replay overwrites them); its results. None for a graph recorded whole."""
        return self.split.tail(list(self.recording.outputs)) if self.split is not None else None

    def _plain(self, args: list):
        self.plain_calls += 1
        return self.compiled(args)

    def _other_shape(self, key: tuple, args: list):
        """A call whose sizes (non-tensor inputs) differ from this runner's: the runner of those sizes."""
        runner = self.shapes.get(key)
        if runner is None:
            if len(self.shapes) + 1 >= self.max_shapes:
                self._note_plain(f"its sizes {list(key)} would make recording {self.max_shapes + 1} of this graph "
                                 f"(at most {self.max_shapes}: config.cudagraph_max_shapes)")
                return self._plain(args)
            runner = self.shapes[key] = CudaGraphRunner(self.compiled, f"{self.name} (sizes {list(key)})",
                                                        **self._options)
            runner._scalar_positions, runner._key = self._scalar_positions, key
        return runner(args)

    def _warm_up(self, args: list):
        self.warm_ups += 1
        self.first_call = [value.data_ptr() if isinstance(value, torch.Tensor) else value for value in args]
        stream = self._make_stream()
        self._release()
        with self._stream_context(stream):
            outputs = self.compiled(args)
        _wait_for(stream)
        self._release()
        return outputs

    def _release(self) -> None:
        if self._release_workspaces is not None:
            self._release_workspaces()

    # ---- recording -------------------------------------------------------------------------------
    def _record(self, args: list):
        if self.recordings >= MAX_RECORDINGS:
            return self._disable(f"inputs read in place moved {self.recordings} times", args)
        static_args = []
        for position, (value, first) in enumerate(zip(args, self.first_call)):
            if not isinstance(value, torch.Tensor):
                self.constants.append((position, value))
                static_args.append(value)
            elif isinstance(value, torch.nn.Parameter) or position in self.mutated or \
                    (value.data_ptr() == first and position not in self.moved):
                self.in_place.append((position, value.data_ptr()))
                static_args.append(value)
            else:
                static = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=value.device)
                broadcast = any(stride == 0 and size > 1 for size, stride in zip(value.shape, value.stride()))
                try:
                    if broadcast:  # an expanded input: its buffer holds each element once, as the input does
                        _held_part(static).copy_(_held_part(value))
                    else:
                        static.copy_(value)
                except RuntimeError as error:  # elements that overlap otherwise (as_strided): no buffer copies them
                    self._reset()
                    return self._disable(f"input {position} cannot be copied into a buffer of its layout: {error}",
                                         args)
                if broadcast:
                    self.broadcast.add(position)
                self.copied.append((position, static))
                static_args.append(static)
        stream = self._make_stream()
        self._release()
        # The default mode records a split graph's head only: its tail's outputs (an LM head's logits) are then
        # made after each replay in memory of their own, never copied out of the pool (kiln/runtime/loader.py Split).
        split = getattr(self.compiled, "split", None) if self.preserve is not None else None
        try:
            recording = self._capture(functools.partial(_run_on, split.head if split is not None else self.compiled,
                                                        static_args), stream,
                                      self.preserve.pool if self.preserve is not None else None)
        except Exception as error:  # a host sync, an unsupported op: run without graphs from now on
            self._reset()
            return self._disable(f"recording failed: {type(error).__name__}: {error}", args)
        finally:
            self._release()
        self.recordings += 1
        self.recording, self.split = recording, split
        if split is None:
            self._classify_outputs(recording.outputs, static_args)
        if self.preserve is not None:
            self.preserve.order()
        recording.replay()
        self.replays += 1
        tail_results = self._run_tail()
        if split is not None:  # the outputs are the tail's: views of the head's values, or memory of the tail's own
            self._classify_outputs(tail_results, static_args, pool=recording.outputs)
        self._check_indices()
        args.clear()
        return self._results(tail_results)

    def _check_indices(self) -> None:
        """A replay runs no wrapper code, so the wrapper's last lines, the kernels' out-of-range-index
        checks (IndexStatus.after_call, runtime/support.py), run here."""
        for status in getattr(self.compiled, "index_status", ()):
            status.after_call()

    def _classify_outputs(self, outputs: list, static_args: list, pool: list | None = None) -> None:
        """Which outputs live in the graph's pool (aliased out, liveness-checked), which are inputs'
        memory (returned as they are) and which alias kiln's copied-in buffers (cloned). `pool`: a split
        graph's recorded head values; an output on none of their memory is the tail's own ("fresh")."""
        input_storages = {_storage_handle(static_args[position]) for position, _ in self.in_place}
        copied_storages = {_storage_handle(static) for _, static in self.copied}
        pool_storages = None if pool is None else {_storage_handle(value) for value in pool
                                                   if isinstance(value, torch.Tensor)}
        self.outputs, handles = [], {}
        for value in outputs:
            if not isinstance(value, torch.Tensor):
                self.outputs.append(("value", value))
                continue
            handle = _storage_handle(value)
            if pool_storages is not None and handle not in pool_storages | input_storages | copied_storages:
                self.outputs.append(("fresh", None))
            elif handle in input_storages:
                self.outputs.append(("input", value))
            elif handle in copied_storages:
                self.outputs.append(("clone", value))
            else:
                self.outputs.append(("pool", value))
                handles[handle] = None
        del outputs
        self.storages = [(handle, _torch.storage_use_count(handle)) for handle in handles]

    def _disable(self, reason: str, args: list):
        self.disabled_reason = reason
        level = logging.INFO if self.preserve is not None else logging.WARNING  # the default mode asked for nothing
        log.log(level, "kiln: CUDA graphs off for graph %s: %s; it runs without them", self.name, reason)
        return self._plain(args)

    # ---- replaying -------------------------------------------------------------------------------
    def _replay_blocker(self, args: list) -> str | None:
        """None when the recording may replay for `args`; "moved" when an in-place input moved."""
        for position, address in self.in_place:
            if args[position].data_ptr() != address:
                return "moved"
        for position, value in self.constants:
            if args[position] != value:
                return f"input {position} is {args[position]!r}, the recording assumed {value!r}"
        if self.preserve is not None:
            return None  # its results are copies: none is on the memory the replay writes
        if self._invalidate is None:
            for handle, count in self.storages:
                if _torch.storage_use_count(handle) > count:
                    return "a result of the previous call is still referenced (its memory would be overwritten)"
            return None
        alive = {ref.cdata for ref in self._previous if not ref.expired()}
        if alive and any(isinstance(value, torch.Tensor) and _storage_handle(value) in alive for value in args):
            return "a result of the previous call is an input of this one (its memory would be overwritten)"
        return None

    def _note_plain(self, reason: str,
                    advice: str = "Release the previous results (or keep a .clone()) to replay it") -> None:
        if self.plain_calls == 0:
            log.warning("kiln: graph %s ran without its CUDA graph: %s. %s", self.name, reason, advice)

    def _results(self, tail_results: list | None = None) -> list:
        """This call's results: the graph's output buffers on storage objects of their own (one per
        buffer, so outputs that share memory still do), weakly referenced for the next replay, or under
        "preserve" on a copy of each buffer; inputs as they are; outputs that alias a copied-in buffer cloned.
        Results never invalidated (from `_held_from` on) get storage objects apart from the others'; a user's
        result over the buffer of one of them (an output the backward also reads) is a copy, so that neither
        invalidating it nor writing into it in place reaches the saved tensor. `tail_results`: a split graph's
        tail's, this call's; its "fresh" ones are returned as they are."""
        if self._invalidate is None and self.preserve is None:
            return [self._result(kind, value) for kind, value in self.outputs]
        copy = self.preserve is not None
        held_handles = {_storage_handle(value) for position, (kind, value) in enumerate(self.outputs)
                        if kind == "pool" and self._is_held(position)}
        storages, held_storages, copies, results = {}, {}, {}, []
        for position, (kind, value) in enumerate(self.outputs):
            if kind == "fresh":
                results.append(tail_results[position])
                continue
            if kind != "pool":
                results.append(self._result(kind, value))
                continue
            handle = _storage_handle(value)
            if self._is_held(position):
                group = held_storages
            elif copy or handle in held_handles:
                group = copies
            else:
                group = storages
            if handle not in group:
                group[handle] = value.untyped_storage().clone() if group is copies else _torch.storage_alias(value)
            results.append(_torch.tensor_on(group[handle], value))
        if not copy:
            self._previous[:] = [_torch.storage_weak_ref(storage) for storage in storages.values()]
            self._held[:] = [_torch.storage_weak_ref(storage) for storage in held_storages.values()]
        return results

    def _is_held(self, position: int) -> bool:
        return self._held_from is not None and position >= self._held_from

    @staticmethod
    def _result(kind: str, value):
        if kind == "pool":
            return value.detach()  # a new tensor on the same memory: its use count shows it is alive
        if kind == "clone":
            return value.clone()
        return value


def _run_on(compiled, inputs: list) -> list:
    """What a recording records: one run of the boxed `compiled` on a copy of `inputs` (it consumes its list)."""
    return list(compiled(list(inputs)))


def _invalidate_alive(previous: list, invalidate: Callable | None, message: str) -> int:
    """Invalidate the storages in `previous` that some tensor still holds; empty it; how many there were."""
    if invalidate is None:  # the use-count policy keeps no references
        return 0
    alive = [ref for ref in previous if not ref.expired()]
    for ref in alive:
        invalidate(ref.cdata, message)
    previous.clear()
    return len(alive)


def _held_part(tensor: torch.Tensor) -> torch.Tensor:
    """The elements `tensor` holds: its broadcast dims (stride 0, size > 1: one element seen several times) cut to
    one, so that a copy into a tensor of its layout writes each memory location once (copy_ refuses a
    destination whose elements overlap)."""
    return tensor[tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None)
                        for size, stride in zip(tensor.shape, tensor.stride()))]


def _ordered(stream):
    """`stream`, ordered after the current one (the warm-up and the recording read what the caller wrote)."""
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream())
    return stream


def _storage_handle(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _wait_for(stream) -> None:
    """The caller's stream waits for the warm-up's (None: tests' stand-in, no streams)."""
    if stream is not None:
        torch.cuda.current_stream().wait_stream(stream)


# The default mode records a graph only where replaying it pays for copying its results. Estimates, not a
# measured break-even: each launch a replay spares saves the host some microseconds (a product extern cost 16-20 us
# of host time on the H200, benchmarks/extern_overhead.py; assumed ~5 us a launch on average), and copying 4 MiB of
# results costs an H100 about 3 us (read and write at ~3 TB/s). Measured: recording a single gelu(x + b) over
# 512 MiB (65536 x 4096 bf16) made the kernels suite time out (2026-12-06, 843d3f9).
MIN_DEFAULT_LAUNCHES = 4
MAX_RESULT_BYTES_PER_LAUNCH = 4 << 20


def wrap(compiled, name: str, example_inputs: list, *, inference: bool, preserve: bool = False,
         launches: int | None = None, output_bytes: int | None = None, saved_from: int | None = None,
         backward: bool = False, tangents: tuple = (), mutated: tuple = ()):
    """`compiled` behind a CudaGraphRunner when CUDA graphs apply to it, else `compiled` (logged why).
    A training step's graphs (not `inference`) say their part: a forward whose outputs from `saved_from` on are
    saved for the backward, or a `backward` (with its `tangents`' positions: inputs always copied in); one that
    says neither runs without graphs.
    `preserve`: the default mode's policy (results stay valid; static shapes only; the device's shared pool;
    inference graphs only), for graphs of at least MIN_DEFAULT_LAUNCHES `launches` whose `output_bytes`
    (None: unknown) are at most MAX_RESULT_BYTES_PER_LAUNCH per launch. `mutated`: the positions of the inputs the
    graph writes (read in place by every runner)."""
    tensors = [value for value in example_inputs if isinstance(value, torch.Tensor)]
    if not inference and preserve:
        reason = "kiln records inference graphs only (this one is part of a training step)"
    elif not inference and saved_from is None and not backward:
        reason = "it is part of a training step, but whether it is the forward or the backward is unknown"
    elif not tensors or not all(value.is_cuda for value in tensors):
        reason = "its inputs are not all CUDA tensors"
    elif not preserve and backward:  # its saved inputs are the forward's, recorded at the forward's second call
        return CudaGraphRunner(compiled, name, block_results=True, warm_up_calls=2, fresh=tangents, mutated=mutated)
    elif not preserve:
        return CudaGraphRunner(compiled, name, saved_from=saved_from, mutated=mutated)
    elif len(tensors) != len(example_inputs):
        reason = "its shapes are symbolic (the default mode records static shapes only)"
    elif len({value.device for value in tensors}) != 1:
        reason = "its inputs are on several devices"
    elif launches is not None and launches < MIN_DEFAULT_LAUNCHES:
        reason = f"{launches} launches: too few to pay for copying its results"
    elif launches is not None and output_bytes is not None and output_bytes > launches * MAX_RESULT_BYTES_PER_LAUNCH:
        reason = f"{output_bytes} bytes of results for {launches} launches: copying them would cost more than it saves"
    else:
        return CudaGraphRunner(compiled, name, preserve=preserving_pool(tensors[0].device), mutated=mutated)
    log.log(logging.DEBUG if preserve else logging.INFO, "kiln: graph %s runs without CUDA graphs: %s", name, reason)
    return compiled
