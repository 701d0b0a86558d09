"""The whole-graph cache: one compiled ATen graph's generated module on disk, so that a new
process compiling the same graph skips lowering, scheduling, the LoopIR passes, memory planning
and codegen (its kernels then load from the kernel caches beside it).

An entry holds what `load_module` needs (codegen/wrapper.py's ModuleSource: the wrapper's text,
the kernels' sources, constants, externs), pickled and sealed with the hash of its key
(runtime/cache.py), so a corrupt, truncated or swapped entry is rebuilt, never trusted. The key
is everything that produced the module:

- kiln's own source (every .py file of the package), torch's and Triton's versions, Python's;
- the devices' names and compute capabilities, torch's global matmul/determinism settings;
- every kiln option (config.snapshot) and the compile mode;
- the graph: each node's op, target, arguments and the metadata lowering reads (each value's
  shape, stride, storage offset, dtype and device; kiln's node tags), the bytes of every
  constant tensor it holds; and each example input's metadata.

A graph with symbolic sizes is not cached (what lowering derives from a ShapeEnv's ranges is not
in its printed form), nor one with a submodule, nor one whose module cannot be pickled (an extern
that is not an ATen op). None of these fail a compile: they compile as without the cache.
`config.graph_cache` (KILN_GRAPH_CACHE=0) turns it off; KILN_DEBUG and the HTML report bypass it,
since they show the stages a hit skips.
"""
from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import pickle
import sys

import torch

from kiln import _torch
from kiln.config import config
from kiln.runtime import cache

log = logging.getLogger("kiln")

_FORMAT = "kiln-graph-cache-1"


class Uncacheable(Exception):
    """What makes a graph's key impossible to state (the graph then compiles as without the cache)."""


@functools.cache
def _kiln_source_digest() -> str:
    """The hash of every .py file of the kiln package: a change to any of them changes every key."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder, folders, files in os.walk(root):
        folders.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as handle:
                    digest.update(handle.read() + b"\0")
    return digest.hexdigest()


def _environment() -> list[str]:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    lines = [_FORMAT, f"kiln {_kiln_source_digest()}", f"torch {torch.__version__}", f"triton {triton_version}",
             f"python {sys.version_info[:3]}", f"default dtype {torch.get_default_dtype()}",
             f"deterministic {torch.are_deterministic_algorithms_enabled()}",
             f"matmul precision {torch.get_float32_matmul_precision()}",
             f"tf32 {torch.backends.cuda.matmul.allow_tf32} {torch.backends.cudnn.allow_tf32}",
             f"reduced precision reductions {torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction} "
             f"{torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}"]
    options = config.snapshot()
    for name in ("debug_dir", "cache_dir", "report", "logs"):  # where output goes, not what is generated
        options.pop(name, None)
    lines += [f"option {name} {value!r}" for name, value in sorted(options.items())]
    return lines


def _describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda:{index} {torch.cuda.get_device_name(index)} sm{major}{minor}"
    return str(device)


def _describe(value, devices: set) -> str:
    """The metadata of a node's value or an example input that lowering reads, as text."""
    if isinstance(value, torch.Tensor):
        sizes = (*value.shape, *value.stride(), value.storage_offset())
        if any(isinstance(size, torch.SymInt) for size in sizes):
            raise Uncacheable("symbolic sizes")
        devices.add(value.device)
        return (f"T({tuple(value.shape)}, {value.stride()}, {value.storage_offset()}, {value.dtype}, "
                f"{value.device}, {value.requires_grad})")
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Uncacheable("a symbolic scalar")
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}({', '.join(_describe(item, devices) for item in value)})"
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return repr(value)
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _specialized_number(value) -> str:
    """A torch-level node's symbolic number (a float argument's `item()`) that its trace specialized, as its value:
    the ATen graph compiled from it has the value baked in, while the torch-level graph is the same for every
    value (`x * sc` where `str(sc)` made the entry guard `sc == 1.5`), so one key served 2.25 the graph of 1.5."""
    if not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ""
    expr = value.node.expr
    return f" = {expr}" if getattr(expr, "is_number", False) else " symbolic"


def _argument(value) -> str:
    if isinstance(value, torch.fx.Node):
        return f"%{value.name}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_argument(item) for item in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key!r}: {_argument(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Uncacheable("a symbolic argument")
    if isinstance(value, torch.Tensor):
        raise Uncacheable("a tensor as an argument")
    return repr(value)


def _target(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if isinstance(target, torch._ops.OpOverload) or module is None or name is None:
        return str(target)
    return f"{module}.{name}"


def _tensor_digest(tensor: torch.Tensor) -> str:
    with _torch.real_tensors():  # a constant is a real tensor, read under the compile's fake mode
        data = tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
        return hashlib.sha256(data.numpy().tobytes()).hexdigest()


def key_of(gm: torch.fx.GraphModule, example_inputs: list, mode: str, *, level: str = "aten",
           extra: list | None = None) -> str | None:
    """The hex key of the module compiled from `gm`, or None when this graph is not cached. `level`:
    "aten" (an ATen graph, whose module is stored under the key) or "torch" (a torch-level graph
    whose key links to its ATen graph's entry: kiln/aot/plain.py), with its `extra` lines."""
    if not config.graph_cache:
        return None
    try:
        devices: set = set()
        lines = [f"level {level}", f"mode {mode}", *(extra or [])]
        for position, value in enumerate(example_inputs):
            lines.append(f"input {position} {_describe(value, devices)}")
        for node in gm.graph.nodes:
            meta = node.meta
            lines.append(f"{node.op} {node.name} {_target(node)} {_argument(node.args)} {_argument(node.kwargs)} "
                         f"| {_describe(meta.get('val'), devices)} | {sorted((meta.get('custom') or {}).items())!r} "
                         f"| {meta.get('kiln_symbolic')!r}{_specialized_number(meta.get('example_value'))}")
            if node.op == "get_attr":
                value = getattr(gm, node.target)
                if not isinstance(value, torch.Tensor):
                    raise Uncacheable(f"a {type(value).__name__} attribute")
                lines.append(f"  = {_describe(value, devices)} {_tensor_digest(value)}")
            elif node.op == "call_module":
                raise Uncacheable("a submodule call")
        lines += sorted(_describe_device(device) for device in devices)
        lines += _environment()
    except Uncacheable as reason:
        log.debug("kiln: graph cache: not cached (%s)", reason)
        return None
    except Exception as error:  # a value the key cannot describe: compiled as without the cache
        cache.warn_once(("graph-cache-key", type(error).__name__),
                        "kiln: a graph's cache key could not be made (%s: %s); it is compiled without the graph "
                        "cache", type(error).__name__, error)
        return None
    key = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    if level == "torch" and config.log_enabled("perf"):  # two processes' texts of one graph's key, diffed, say
        try:                                              # why a warm start found no link (docs/design/runtime_and_debug.md)
            cache.store(cache.entry_name("keys", key, ".txt"), "\n".join(lines).encode())
        except OSError:
            pass
    return key


# ---- entries ----

def _op_by_name(name: str, overload: str):
    namespace, op = name.split("::")
    packet = getattr(getattr(torch.ops, namespace), op)
    return packet if overload is None else getattr(packet, overload)


class _Pickler(pickle.Pickler):
    """Pickles ATen ops by name (torch's op objects cannot be pickled)."""

    def reducer_override(self, value):
        if isinstance(value, torch._ops.OpOverload):
            return _op_by_name, (value._schema.name, value._overloadname)
        if isinstance(value, torch._ops.OpOverloadPacket):
            return _op_by_name, (value._qualified_op_name, None)
        return NotImplemented


def _relative(key: str) -> str:
    return cache.entry_name("graphs", key, ".pkl")


def _read(key: str) -> dict | None:
    """The record stored under `key`, or None (a miss)."""
    found: dict = {}

    def problem(path: str) -> str | None:
        reason = cache.check_sealed(path, key)
        if reason is not None:
            return reason
        with _torch.real_tensors():  # compiling runs under the graph's fake mode: constants are real tensors
            record = pickle.loads(cache.unseal(path))  # kiln's own entry, whole and of this key (checked above)
        if not isinstance(record, dict) or record.get("format") != _FORMAT:
            return "it is not a graph-cache record of this kiln"
        found.update(record)
        return None

    try:
        if cache.lookup(_relative(key), problem) is None:
            return None
    except Exception as error:  # an entry that unpickles badly is a miss, reported once
        cache.warn_once(("graph-cache-load", type(error).__name__),
                        "kiln: a graph-cache entry could not be read (%s: %s); compiling the graph instead",
                        type(error).__name__, error)
        return None
    return found


def load(key: str):
    """(the ModuleSource stored under `key`, its device type), or None (a miss). The module's
    `backend` is None: the caller attaches the kernel backend of that device type."""
    record = _read(key)
    if record is None or "module" not in record:
        return None
    return record["module"], record["device_type"]


def load_link(key: str) -> tuple[str, dict] | None:
    """(the ATen graph's key, the facts stored with it) that a torch-level graph's `key` links to, or None."""
    record = _read(key)
    if record is None or "aten_key" not in record:
        return None
    return record["aten_key"], record["facts"]


def store_link(key: str, aten_key: str, facts: dict) -> None:
    """Link a torch-level graph's `key` to the ATen graph entry `aten_key` (kiln/aot/plain.py)."""
    _write(key, {"format": _FORMAT, "aten_key": aten_key, "facts": facts})


def store(key: str, module, device_type: str) -> bool:
    """Keep `module` (a ModuleSource) under `key`; whether it was kept (one pickle cannot hold is not)."""
    backend, module.backend = module.backend, None
    try:
        return _write(key, {"format": _FORMAT, "device_type": device_type, "module": module})
    finally:
        module.backend = backend


def _write(key: str, record: dict) -> bool:
    try:
        buffer = io.BytesIO()
        with _torch.real_tensors():
            _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(record)
    except Exception as error:  # an extern or constant pickle cannot hold: compiled, just not cached
        log.debug("kiln: graph cache: not stored (%s: %s)", type(error).__name__, error)
        return False
    try:
        cache.store(_relative(key), cache.seal(buffer.getvalue(), key))
    except OSError as error:
        cache.warn_once(("graph-cache-store", type(error).__name__),
                        "kiln: a graph-cache entry could not be written (%s: %s)", type(error).__name__, error)
        return False
    return True
