"""The dispatcher: per code object, cache entries of (guard, compiled callable).

`Dispatcher(fn)` is what `kiln.compile` returns with `config.frontend == "kiln"`.
A call runs the cache entries' guard functions newest first; the first that
returns None has its entry called. On a miss the frame is traced
(`capture_frame`), which adds an entry; a recompile logs why the previous entries
failed (logger "kiln", `KILN_LOGS=recompiles`). After `RECOMPILE_LIMIT` entries for
one code object, misses run eagerly with one warning. A resume function entered in a loop
whose body breaks on every iteration (a ModuleList of blocks that break) gets a new entry per
iteration, since the iterator it is passed holds fewer items each time: its limit counts the
entries of each iteration apart (`loop_position`), up to `LOOP_RECOMPILE_LIMIT` in all. A miss traces under the
process's compile lock (kiln/runtime/locks.py) and first looks again, so threads that
miss at once trace once and share the entry. A frame the interpreter
cannot capture runs eagerly (its entry's guards cover everything the trace read
before it stopped, so the same inputs skip the retrace), unless `fullgraph=True`,
which raises `FullgraphError` naming the construct and its source line.

Modules are compiled through `_call_module(module, *args, **kwargs)`, a kiln-owned
frame whose only instruction of interest calls the module, so hooks and `forward`
are traced by the same rules as any inlined call.
"""
from __future__ import annotations

import functools
import inspect
import logging
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kiln import _torch
from kiln.backend import KilnCompileError
from kiln.config import config
from kiln.frontend.dynamic import DynamicPolicy
from kiln.frontend.errors import HOW_TO_FIX, HOW_TO_FIX_EAGER, FullgraphError, GraphRaised, Unsupported
from kiln.frontend import break_analysis, break_calls, resume, resume_codegen, wrapped_calls
from kiln.frontend.guards import FrameSignature
from kiln.frontend.interpreter import BreakHere, Frame
from kiln.frontend.output import OutputGraph
from kiln.frontend.sources import ClosureCellSource, LocalSource, NamedSource
from kiln.frontend.variables.modules import untraceable_hooks
from kiln.runtime.heap import frozen_heap
from kiln.frontend.variables.functions import CellVariable
from kiln.runtime.locks import compile_lock
from kiln.runtime.support import KilnIndexError

log = logging.getLogger("kiln")

RECOMPILE_LIMIT = 8
# the entries of one resume function over all the iterations of a loop that breaks (RECOMPILE_LIMIT for each)
LOOP_RECOMPILE_LIMIT = 64
_MISSING = object()


@dataclass
class CacheEntry:
    """One traced version of a frame: run `entry` when `guard` returns None."""

    guard: Callable
    entry: Callable
    guard_source: str
    entry_source: str
    graph_module: torch.fx.GraphModule | None
    eager_reason: str | None = None  # set when the frame could not be captured and runs eagerly
    loop_position: tuple = ()  # a resume function's: the lengths of the iterators it was passed (loop_position)


@dataclass
class CodeCache:
    """The entries of one code object, newest first."""

    entries: list[CacheEntry] = field(default_factory=list)
    over_limit: bool = False
    over_limit_positions: set = field(default_factory=set)  # a resume function's loop iterations past the limit
    by_position: dict = field(default_factory=dict)  # loop position -> its entries, newest first (loop_position)
    defaults: tuple | None = None  # (__defaults__, __kwdefaults__ items) the entries were made with
    dynamic: DynamicPolicy | None = None  # what its traces make symbolic (sizes, scalars that changed)

    def add(self, entry: CacheEntry) -> None:
        self.entries.insert(0, entry)
        self.by_position.setdefault(entry.loop_position, []).insert(0, entry)

    def clear(self) -> None:
        self.entries.clear()
        self.by_position.clear()


@dataclass
class FrontendStats:
    """Counters tests and `kiln.explain` read."""

    captures: int = 0
    graphs: int = 0
    recompiles: int = 0
    eager_frames: int = 0
    breaks: int = 0


stats = FrontendStats()


@dataclass
class GraphBreak:
    """One graph break: why the trace stopped, and where (`file:line in function`)."""

    reason: str
    location: str
    frame: str  # the compiled function whose entry breaks


# graph compiler -> the factory of its callees' dispatchers (Dispatcher.callee_factory)
_callee_factories: "weakref.WeakKeyDictionary[Callable, Callable]" = weakref.WeakKeyDictionary()

# Called with each GraphBreak and each (Dispatcher, CacheEntry) made (kiln.explain listens).
break_listeners: list[Callable] = []
capture_listeners: list[Callable] = []


def _same_defaults(first: tuple, second: tuple) -> bool:
    """Whether two (__defaults__, __kwdefaults__ items) pairs hold the same objects."""
    (positional, keywords), (other_positional, other_keywords) = first, second
    if positional is not other_positional or (keywords is None) != (other_keywords is None):
        return False
    return keywords is None or (len(keywords) == len(other_keywords) and all(
        name == other_name and value is other_value
        for (name, value), (other_name, other_value) in zip(keywords, other_keywords)))


def _call_given_function(*args, __fn, **kwargs):
    """The eager entry of a closure's dispatcher: the function it is given, as it is."""
    return __fn(*args, **kwargs)


def _call_module(module, *args, **kwargs):
    """kiln's frame for a compiled module or other callable object: hooks and forward are traced from here."""
    return module(*args, **kwargs)


def _eager_reruns(error: BaseException | None) -> bool:
    """Whether a graph's `error` is one that running its frame eagerly reproduces: not kiln's CUDA index
    reports (runtime/support.py KilnIndexError says why), nor a CUDA error (torch's AcceleratorError, or a
    Triton launch's "Triton Error [CUDA]"), which leaves the context unusable for the eager run too (it
    would fail at some unrelated op)."""
    if isinstance(error, KilnIndexError):
        return error.eager_reruns
    if isinstance(error, _torch.ACCELERATOR_ERRORS):
        return False
    return not (isinstance(error, RuntimeError) and "Triton Error [CUDA]" in str(error))


class Dispatcher:
    """A compiled function: guards in front of traced versions of it."""

    __kiln_dispatcher__ = True  # called inside another trace, its function is traced inline (variables/kinds.py)

    def __init__(self, fn: Callable, graph_compiler: Callable, *, fullgraph: bool = False,
                 dynamic: bool | None = None):
        bound_self = None
        self.dynamic = dynamic
        self._caller_handles_exception = False  # at the last miss (a trace's sys.exc_info() reads it)
        self.binds_like_a_function = not isinstance(fn, staticmethod)
        if isinstance(fn, staticmethod):  # `@kiln.compile` above `@staticmethod`
            fn = fn.__func__
        if isinstance(fn, torch.nn.Module):
            bound_self, fn = fn, _call_module
        elif isinstance(fn, types.MethodType):
            bound_self, fn = fn.__self__, fn.__func__
        if not isinstance(fn, types.FunctionType):  # a partial, a callable object, a builtin...
            if not callable(fn):
                raise TypeError(f"kiln frontend compiles callables, not {type(fn).__name__}")
            bound_self, fn = fn, _call_module
        self.fn = fn
        self.bound_self = bound_self
        # a module's call: its hooks are checked at each call (kiln cannot trace FSDP2's: ForwardCompiled)
        self._module = bound_self if fn is _call_module and isinstance(bound_self, torch.nn.Module) else None
        self._forward_compiled = None
        self.graph_compiler = graph_compiler
        self.fullgraph = fullgraph
        self.caches: dict[types.CodeType, CodeCache] = {}
        self._warned: set[str] = set()
        self._resumes: dict[tuple, Dispatcher] = {}
        self._use_current_function()

    def _use_current_function(self) -> None:
        """Take `fn`'s code and defaults as they are now.

        The guard and entry functions bind parameters with the signature's defaults, and a
        code object's entries were traced from it, so a replaced `__code__`, `__defaults__`
        or `__kwdefaults__` (or a kw-only default set in place) must be seen before any
        guard runs: entries made with other defaults are dropped.
        """
        fn = self.fn
        kwdefaults = fn.__kwdefaults__
        self._traced_code, self._traced_defaults = fn.__code__, fn.__defaults__
        self._traced_kwdefaults = kwdefaults
        self._traced_kwdefault_values = tuple(kwdefaults.items()) if kwdefaults is not None else None
        self.signature = FrameSignature.of(fn)
        # A closure's guard and entry take the function as `__fn=` (its cells differ between functions of one code)
        self._closure_parameter = bool(fn.__code__.co_freevars)
        self._cache = self.caches.setdefault(fn.__code__, CodeCache())
        self._iterator_parameters = resume_codegen.iterator_parameters(fn.__code__) if self.bound_self is None else ()
        defaults = (fn.__defaults__, self._traced_kwdefault_values)
        if self._cache.defaults is not None and not _same_defaults(self._cache.defaults, defaults):
            self._cache.clear()  # their guards and entries bind the old defaults
        self._cache.defaults = defaults

    def _function_changed(self) -> bool:
        fn = self.fn
        if fn.__code__ is not self._traced_code or fn.__defaults__ is not self._traced_defaults:
            return True
        kwdefaults = fn.__kwdefaults__
        if kwdefaults is not self._traced_kwdefaults:
            return True
        return kwdefaults is not None and (len(kwdefaults) != len(self._traced_kwdefault_values) or any(
            kwdefaults.get(name, _MISSING) is not value for name, value in self._traced_kwdefault_values))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.bound_self is not None:
            args = (self.bound_self, *args)
        if self._function_changed():
            self._use_current_function()
        if self._closure_parameter:
            return self._call_closure(self.fn, args, kwargs)
        for entry in self._entries_for(args):
            if entry.guard(*args, **kwargs) is None:
                return entry.entry(*args, **kwargs)
        return self._miss(args, kwargs)

    def _entries_for(self, args: tuple) -> list[CacheEntry]:
        """The entries that may serve these arguments: all of them, or a resume function's for this iteration of
        the loop around its break (each iteration's guards check its iterators' lengths: the others would fail)."""
        if not self._iterator_parameters:
            return self._cache.entries
        return self._cache.by_position.get(self.loop_position(args), ())

    def _call_with_forward_compiled(self, args: tuple, kwargs: dict) -> Any:
        if self._forward_compiled is None:
            self._forward_compiled = wrapped_calls.ForwardCompiled(self.callee_factory())
            if config.log_enabled("graph_breaks"):
                log.warning("kiln: %s runs its hooks in Python (%s), its forward compiled", self._name(),
                            untraceable_hooks(self._module))
        return self._forward_compiled(self._module, *args, **kwargs)

    def call_function(self, fn: types.FunctionType, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` for a function that runs as this dispatcher's does except for its closure
        cells: the same code, globals, builtins and default objects (break_calls._same_function_behaviour). A
        closure made anew on each call (an inner function, a resume function over a frame's cells) is traced
        once: the entries read the cells of the function they are given."""
        if self._function_changed():
            self._use_current_function()
        if not self._closure_parameter:
            return self(*args, **kwargs)
        return self._call_closure(fn, args, kwargs)

    def _call_closure(self, fn: types.FunctionType, args: tuple, kwargs: dict) -> Any:
        for entry in self._entries_for(args):
            if entry.guard(*args, __fn=fn, **kwargs) is None:
                return entry.entry(*args, __fn=fn, **kwargs)
        return self._miss(args, kwargs, fn)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """A compiled plain function binds like a function: `@kiln.compile` works on methods."""
        if instance is None or self.bound_self is not None or not self.binds_like_a_function:
            return self
        return types.MethodType(self, instance)

    @property
    def entries(self) -> list[CacheEntry]:
        return self._cache.entries

    @property
    def forward_dispatchers(self) -> list:
        """A module's call whose hooks run in Python (ForwardCompiled): the dispatchers of its forward."""
        return list(self._forward_compiled.dispatchers()) if self._forward_compiled is not None else []

    def _miss(self, args: tuple, kwargs: dict, fn: types.FunctionType | None = None) -> Any:
        if self._module is not None and untraceable_hooks(self._module) is not None:
            # hooks kiln cannot trace (an entry's guard checks the module has none): checked on a miss only
            return self._call_with_forward_compiled(args[1:], kwargs)
        if fn is not None:  # a closure: the guards and entries take it, and an eager run calls it
            kwargs = {**kwargs, "__fn": fn}
        # read here, outside kiln's own handlers: the caller's (a trace's sys.exc_info() needs it)
        self._caller_handles_exception = sys.exc_info()[0] is not None
        with compile_lock:
            run = self._entry_added_meanwhile(args, kwargs) or self._compile_miss(args, kwargs)
        if fn is not None and (run is self.fn or run is fn):
            del kwargs["__fn"]
            return fn(*args, **kwargs)
        return run(*args, **kwargs)

    def _entry_added_meanwhile(self, args: tuple, kwargs: dict) -> Callable | None:
        """The entry another thread added for these arguments while this one waited for the lock."""
        for entry in self._cache.entries:
            if entry.guard(*args, **kwargs) is None:
                return self.fn if entry.eager_reason is not None else entry.entry
        return None

    def loop_position(self, args: tuple) -> tuple:
        """For a resume function, the lengths of the iterators it is passed as tuples of their remaining items
        (resume_codegen.iterator_parameters): which iteration of the loop around the break it continues. ()
        otherwise."""
        return tuple(len(args[position]) if position < len(args) and isinstance(args[position], tuple) else -1
                     for position in self._iterator_parameters)

    def _compile_miss(self, args: tuple, kwargs: dict) -> Callable:
        """Trace a new entry for these arguments (or give up past the limit); what to run for them."""
        cache = self._cache
        position = self.loop_position(args)
        if cache.over_limit or position in cache.over_limit_positions:
            return self.fn
        same_position = len(cache.by_position.get(position, ()))
        if same_position >= RECOMPILE_LIMIT or len(cache.entries) >= LOOP_RECOMPILE_LIMIT:
            if same_position >= RECOMPILE_LIMIT and position:
                cache.over_limit_positions.add(position)
                where = f" at loop position {position}"
            else:
                cache.over_limit = True
                where = ""
            log.warning("kiln: %s hit the recompile limit (%d)%s; it runs eagerly from now on. Last reason: %s",
                        self._name(), RECOMPILE_LIMIT, where, self._failure_reasons(args, kwargs)[0])
            return self.fn
        if cache.entries:
            stats.recompiles += 1
            if config.log_enabled("recompiles"):
                if position and not same_position:  # a loop iteration this resume function has not seen
                    reasons = [f"a new loop iteration (iterators of {', '.join(map(str, position))} items left)"]
                else:
                    reasons = [entry.guard(*args, **kwargs) or "guards pass" for entry in cache.by_position[position]]
                log.warning("kiln: recompiling %s: %s", self._name(), "; ".join(reasons))
        entry = self._capture(args, kwargs)
        entry.loop_position = position
        cache.add(entry)
        return self.fn if entry.eager_reason is not None else entry.entry

    def _failure_reasons(self, args: tuple, kwargs: dict) -> list[str]:
        return [entry.guard(*args, **kwargs) or "guards pass" for entry in self._cache.entries]

    def _name(self) -> str:
        code = self.fn.__code__
        if self.bound_self is not None and self.fn is _call_module:
            if isinstance(self.bound_self, torch.nn.Module):
                return f"{type(self.bound_self).__qualname__}.forward"
            return repr(self.bound_self)[:100]
        return f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"

    def _capture(self, args: tuple, kwargs: dict) -> CacheEntry:
        with frozen_heap():  # collections while it compiles scan only what the compile makes
            entry = self._capture_or_retrace(args, kwargs)
        for listener in capture_listeners:
            listener(self, entry)
        return entry

    def _capture_or_retrace(self, args: tuple, kwargs: dict) -> CacheEntry:
        grad = torch.is_grad_enabled()  # a compile that raises midway (in AOTAutograd) may leave it switched
        try:
            return self._capture_entry(args, kwargs)
        except Exception as error:
            torch._C._set_grad_enabled(grad)
            policy = self._dynamic_policy()
            if not _torch.is_tensorify_restart(error) or policy.static_floats:
                raise
            # AOTAutograd could not keep a float argument symbolic (torch 2.11): trace again with floats as
            # constants, as Dynamo does on the same torch.
            policy.static_floats = True
            if config.log_enabled("recompiles"):
                log.warning("kiln: %s: float arguments are specialized (torch %s cannot tensorify their "
                            "arithmetic)", self._name(), torch.__version__)
            return self._capture_entry(args, kwargs)

    def _capture_entry(self, args: tuple, kwargs: dict) -> CacheEntry:
        stats.captures += 1
        fn = self.fn
        if "__fn" in kwargs:  # a closure of this code (call_function): trace it, with its cells
            kwargs = dict(kwargs)
            fn = kwargs.pop("__fn")
        output = OutputGraph(self.graph_compiler, self._dynamic_policy())
        output.caller_handles_exception = self._caller_handles_exception
        try:
            traced = capture_frame(output, fn, self.signature, args, kwargs)
        except Unsupported as error:
            # fullgraph=True and strict mode (KILN_STRICT=1) raise instead: a break runs code eagerly.
            point = None if self.fullgraph or config.strict else self._break_point(error)
            if point is None:
                return self._callee_compiled_entry(output, error, fn) or self._eager_entry(output, error)
            output = OutputGraph(self.graph_compiler, self._dynamic_policy())
            output.caller_handles_exception = self._caller_handles_exception
            output.break_point = point
            try:
                traced = capture_frame(output, fn, self.signature, args, kwargs, self)
            except Unsupported as second:
                second.message = f"{second.message} (while compiling up to a graph break: {point.reason})"
                return self._eager_entry(output, second)
            except KilnCompileError:
                raise
            except Exception as failure:  # a frontend bug must not break the user's program
                if _torch.is_tensorify_restart(failure):
                    raise  # _capture traces again with floats static
                unexpected = Unsupported(f"kiln's frontend failed at a graph break: {type(failure).__name__}: "
                                         f"{failure}")
                unexpected.locations = [point.location]
                if config.strict:
                    raise FullgraphError(f"kiln.compile cannot capture {self._name()}: "
                                         f"{unexpected.describe()}") from failure
                return self._eager_entry(output, unexpected)
            self._record_break(point.reason, point.location)
        except KilnCompileError:
            raise  # the backend already chose to raise (strict mode or fullgraph=True)
        except Exception as error:  # a frontend bug must not break the user's program
            if _torch.is_tensorify_restart(error):
                raise  # _capture traces again with floats static
            unexpected = Unsupported(f"kiln's frontend failed: {type(error).__name__}: {error}")
            unexpected.locations = list(getattr(error, "kiln_locations", ()))
            if self.fullgraph or config.strict:
                raise FullgraphError(f"kiln.compile cannot capture {self._name()}: {unexpected.describe()}") from error
            return self._eager_entry(output, unexpected)
        if traced.graph_module is not None:
            stats.graphs += 1
        if config.log_enabled("guards"):
            log.warning("kiln: guards for %s:\n%s", self._name(), traced.guard_source)
        entry = self._eager_when_the_graph_raises(traced.entry) if traced.graph_module is not None else traced.entry
        return CacheEntry(traced.guard, entry, traced.guard_source, traced.entry_source, traced.graph_module)

    def _eager_when_the_graph_raises(self, entry: Callable) -> Callable:
        """`entry`, but run the frame eagerly when its graph raises (errors.GraphRaised): `x.add_(1); log.append(1);
        x[i]` with `i` out of range must leave `x` added to and `log` appended to, as eager does, before it raises."""
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return entry(*args, **kwargs)
            except GraphRaised as raised:
                if not _eager_reruns(raised.__cause__):
                    raise raised.__cause__ from None
            # eager's error is raised outside the handler: its traceback is the program's own
            fn = kwargs.pop("__fn", self.fn)  # a closure's entry is given the function it stands for
            return fn(*args, **kwargs)
        return run

    def _break_point(self, error: Unsupported) -> resume.BreakPoint | None:
        """Where the frame can break for `error`, or None (then it runs eagerly).

        The break goes to the outermost frame that can resume (as TorchDynamo's does): the
        compiled function itself, or, below kiln's own frame for a module without hooks, the
        module's forward. A call there into a function that failed deeper is made through
        that function's own dispatcher, which breaks at the next level in turn.
        """
        frames = self._breakable_frames(error)
        if frames is None:
            return None
        chosen = frames[0]
        instruction = chosen.current
        index = chosen.ip - 1
        span = break_analysis.inlined_comprehension(chosen.code, index)
        if span is not None:  # 3.12+: the whole comprehension runs in Python (break_analysis.Comprehension)
            index = span.start
        elif instruction is None or not resume.can_break_at(instruction):
            return None
        if break_analysis.resumable(chosen.code) is not None or break_analysis.protected(chosen.code, index):
            return None
        return resume.BreakPoint(chosen.depth, chosen.code, index, chosen.visits[index] - 1, error.message,
                                 error.locations[0] if error.locations else chosen.location(),
                                 direct_call=error.reads_frames)

    def _breakable_frames(self, error: Unsupported) -> list | None:
        """The interpreter frames `error` left, outermost first from the one a break could go to (the
        compiled function's, or a hook-less module's forward); None when no break can go anywhere."""
        if not config.graph_breaks or not error.breakable:
            return None
        frames = list(reversed(error.frames))  # the compiled frame first
        if not frames or frames[0].parent is not None:
            return None
        if frames[0].code is _call_module.__code__:
            if len(frames) < 2 or wrapped_calls.hooked(self.bound_self) or frames[1].parent is not frames[0]:
                return None
            frames = frames[1:]
        return frames

    def _callee_compiled_entry(self, output: OutputGraph, error: Unsupported, fn) -> CacheEntry | None:
        """Where the outermost frame cannot break, but calls the failing function through a closure cell (a
        decorator's wrapper, its call in an except clause): an entry that runs the frame in Python and that function
        through its own dispatcher (kiln/frontend/wrapped_calls.py); None elsewhere."""
        if self.fullgraph or config.strict:
            return None
        frames = self._breakable_frames(error)
        if frames is None or len(frames) < 2 or frames[1].parent is not frames[0]:
            return None
        module_call = fn is _call_module
        if module_call:
            fn = wrapped_calls.forward_function(self.bound_self)
        if fn is None or fn.__code__ is not frames[0].code:
            return None
        position = wrapped_calls.callee_cell(fn, frames[1].code)
        if position is None:
            return None
        entry = wrapped_calls.CalleeCompiled(position, self.callee_factory(), module_call=module_call,
                                             fn=None if module_call or self._closure_parameter else fn)
        self._record_break(f"{error.message} (in a call made where {frames[0].code.co_qualname} cannot break: "
                           f"that frame runs in Python, the function it calls is compiled on its own)",
                           error.locations[0] if error.locations else frames[0].location())
        guard, guard_source = output.guards.build(self.signature, output.guard_namespace)
        return CacheEntry(guard, entry, guard_source, "", None)

    def _record_break(self, reason: str, location: str) -> None:
        stats.breaks += 1
        graph_break = GraphBreak(reason, location, self._name())
        if config.log_enabled("graph_breaks"):
            log.warning("kiln: graph break in %s: %s\n  at %s", graph_break.frame, reason, location)
        for listener in break_listeners:
            listener(graph_break)

    def resume_dispatcher(self, frame, code: types.CodeType) -> "Dispatcher":
        """The dispatcher of the resume function `code` continuing `frame` (one per code and globals). A resume
        function with a closure (the frame's cells) is called with the cells of each call
        (`resume_codegen.closure_function`, `call_function`); its dispatcher's own function holds empty cells."""
        key = (code, id(frame.fn_globals))
        dispatcher = self._resumes.get(key)
        if dispatcher is None:
            cells = tuple(types.CellType() for _ in code.co_freevars)
            function = types.FunctionType(code, frame.fn_globals, code.co_name, None, cells or None)
            dispatcher = Dispatcher(function, self.graph_compiler)
            dispatcher._resumes = self._resumes  # one family: a resume function breaking again finds the same ones
            self._resumes[key] = dispatcher
        return dispatcher

    def callee_factory(self) -> Callable:
        """What makes the dispatcher of a function or module called at a graph break: one factory per
        backend, so a callee reached from several frames is compiled (and cached) once."""
        factory = _callee_factories.get(self.graph_compiler)
        if factory is None:
            factory = _callee_factories[self.graph_compiler] = functools.partial(Dispatcher,
                                                                                   graph_compiler=self.graph_compiler)
        return factory

    def _dynamic_policy(self) -> DynamicPolicy:
        """What the next trace makes symbolic: the code object's policy remembers the sizes and int/float
        arguments its traces saw, and a miss whose sizes or scalars changed makes those symbolic (dynamic.py)."""
        if self._cache.dynamic is None:
            self._cache.dynamic = DynamicPolicy(mode=self.dynamic)
        return self._cache.dynamic

    def _eager_entry(self, output: OutputGraph, error: Unsupported) -> CacheEntry:
        """An entry that runs the frame eagerly, guarded by what the trace read before it stopped."""
        if self.fullgraph or config.strict:
            flag = "fullgraph=True" if self.fullgraph else "strict mode (KILN_STRICT=1)"
            hint = HOW_TO_FIX if self.fullgraph else HOW_TO_FIX.replace("fullgraph=True", "strict mode")
            raise FullgraphError(f"kiln.compile with {flag} cannot capture {self._name()}: "
                                 f"{error.describe()}\n  ({hint})") from None
        stats.eager_frames += 1
        if error.describe() not in self._warned:  # once per reason, not once per recompile
            self._warned.add(error.describe())
            log.warning("kiln: %s runs eagerly (not compiled): %s\n  (to compile it: %s)", self._name(),
                        error.describe(), HOW_TO_FIX_EAGER)
        guard, guard_source = output.guards.build(self.signature, output.guard_namespace)
        run = _call_given_function if self._closure_parameter else self.fn
        return CacheEntry(guard, run, guard_source, "", None, eager_reason=error.describe())


def capture_frame(output: OutputGraph, fn: types.FunctionType, signature: FrameSignature, args: tuple,
                  kwargs: dict, dispatcher: Dispatcher | None = None):
    """Trace one call of `fn` with these arguments; returns the TracedGraph.

    With `output.break_point` set, the trace stops there and the entry ends in the graph
    break (`dispatcher` makes its resume functions).
    """
    output.guard_namespace["__fn"] = fn
    bound = inspect.signature(fn, follow_wrapped=False).bind(*args, **kwargs)
    bound.apply_defaults()
    code = fn.__code__
    root = Frame.__new__(Frame)  # for wrap() during argument setup; replaced by the real frame below
    root.output = output
    local_values = {_local_name(code, name): _wrap_argument(root, name, value) for name, value in bound.arguments.items()}
    cells = {}
    for name in code.co_cellvars:
        cells[name] = CellVariable(local_values.pop(name) if name in local_values else CellVariable.EMPTY)
    for index, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
        cells[name] = output.outside_cell(cell, ClosureCellSource(NamedSource("__fn"), index))
    frame = Frame(output, code, fn.__globals__, local_values, cells)
    broken = None
    try:
        result = frame.run()
    except BreakHere as stop:
        if dispatcher is None:
            raise AssertionError("a trace stopped at a graph break nobody asked for") from None
        broken, result = stop.frame, None
    finally:
        grad_at_end, autocast_clean = output.restore_global_state()
    if not autocast_clean:
        raise Unsupported("the function leaves autocast changed " +
                          ("at a graph break" if broken is not None else "when it returns"))
    if broken is None:
        return output.finish(result, signature, code.co_name, grad_at_end=grad_at_end)
    call_name = None if output.break_point.direct_call else output.named_source("__call_compiled", functools.partial(
        break_calls.call_compiled, dispatcher.callee_factory())).expr()
    tail = resume.break_tail(broken, dispatcher.resume_dispatcher, call_name)
    return output.finish(None, signature, code.co_name, tail, grad_at_end=grad_at_end,
                         stand_in=(broken.code, broken.lineno(), broken.fn_globals))


def _local_name(code: types.CodeType, parameter: str) -> str:
    """The frame's name for a parameter: inspect calls a comprehension's `.0` `implicit0` (the guard and entry
    functions take it by that name)."""
    if parameter.startswith("implicit") and parameter[len("implicit"):].isdigit() and \
            f".{parameter[len('implicit'):]}" in code.co_varnames[:code.co_argcount]:
        return f".{parameter[len('implicit'):]}"
    return parameter


def _wrap_argument(root: Frame, name: str, value: Any):
    return root.wrap(value, LocalSource(name))
