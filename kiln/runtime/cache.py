"""kiln's on-disk caches under `KILN_CACHE_DIR`: how entries are named, written, read and checked.

Every entry is named by the hash of its key (everything that produced it) and is checked
against that key, not against anything written beside it, each time it is read:

- a source entry (a Triton kernel, a wrapper: `cache_path`) holds its text, which is its key:
  it is used only when its bytes are exactly that text;
- a sealed entry (a C++ library: `seal`, `check_sealed`) ends with a trailer holding its key's
  hash and its body's hash and length, so one file says what it is and that it is whole: a
  library swapped or rotated with another entry, truncated or corrupted is rejected before
  anything loads it;
- a record (the C++ toolchain's: `load_record`, `store_record`) is JSON holding its key and
  fields of known types.

An entry that is unreadable or fails its check (corrupt, truncated, swapped, not UTF-8, a
directory, wrong fields) logs one warning and is rebuilt; it never fails a compile and is
never trusted. Entries are written atomically (temp file + rename in the same folder), so
processes sharing a cache never see a half-written one and the last writer wins with a
whole entry. When the cache dir cannot be written (read-only, or a path under a file), the
process warns once and keeps its new entries in a private temporary folder instead.
Triton keeps its own cache of compiled GPU binaries beside these.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from typing import Callable

from kiln.config import config

log = logging.getLogger("kiln")

_fallback_roots: dict = {}  # configured cache dir that could not be written -> this process's stand-in
_warned: set = set()  # what has been warned about (a warning is logged once per process)
_lock = threading.RLock()  # guards both: libraries are built (and stored) on a pool of threads


def source_hash(text: str) -> str:
    """The hex sha256 of `text`: what entries are named by."""
    return hashlib.sha256(text.encode()).hexdigest()


def warn_once(topic, message: str, *args) -> None:
    """Log `message` unless a warning on `topic` (any hashable) was already logged in this process."""
    with _lock:
        if topic in _warned:
            return
        _warned.add(topic)
    log.warning(message, *args)


def entry_name(kind: str, digest: str, suffix: str) -> str:
    """The path of an entry relative to the cache root: `<kind>/<2 hex>/k<digest><suffix>`."""
    return os.path.join(kind, digest[:2], f"k{digest}{suffix}")


def _roots() -> list:
    configured = config.cache_dir
    fallback = _fallback_roots.get(configured)
    return [configured] if fallback is None else [configured, fallback]


def lookup(relative: str, problem: Callable[[str], "str | None"]) -> str | None:
    """The path of a valid entry `relative`, or None when there is none.

    `problem(path)` says what is wrong with the entry at `path` (None: nothing). An entry that
    fails it, or that cannot be read at all, is reported once and treated as absent, so the
    caller rebuilds it (its `store` replaces the bad file).
    """
    for root in _roots():
        path = os.path.join(root, relative)
        try:
            reason = problem(path)
        except (FileNotFoundError, NotADirectoryError):  # absent (or the cache dir is a file): nothing to say
            continue
        except Exception as error:  # unreadable: a directory, no permission, not UTF-8, bad JSON...
            reason = f"{type(error).__name__}: {error}"
        if reason is None:
            return path
        warn_once(("invalid", path), "kiln: cache entry %s is invalid (%s); rebuilding it", path, reason)
    return None


def store(relative: str, data: bytes) -> str:
    """Write `data` as the entry `relative` atomically; its path. A cache dir that cannot be
    written is replaced, for this process, by a private temporary folder (one warning)."""
    configured = config.cache_dir
    fallback = _fallback_roots.get(configured)
    if fallback is None:
        try:
            return _write_atomically(os.path.join(configured, relative), data)
        except OSError as error:
            fallback = _fallback_root(configured, error)
    return _write_atomically(os.path.join(fallback, relative), data)


def _fallback_root(configured: str, error: OSError) -> str:
    """This process's stand-in for the cache dir `configured`, made (and warned about) once."""
    with _lock:
        if configured not in _fallback_roots:
            fallback = tempfile.mkdtemp(prefix="kiln-cache-")
            atexit.register(shutil.rmtree, fallback, True)
            _fallback_roots[configured] = fallback
            warn_once(("unwritable", configured),
                      "kiln: cannot write the cache dir %s (%s: %s); this process keeps its cache in %s instead "
                      "(set KILN_CACHE_DIR to a writable folder)", configured, type(error).__name__, error, fallback)
        return _fallback_roots[configured]


def _write_atomically(path: str, data: bytes) -> str:
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return path


# ---- source entries: the file holds the text that is its key ----

def cache_path(kind: str, text: str, suffix: str = ".py") -> str:
    """Path of a cache file holding exactly `text` (written if absent, corrupt or not `text`)."""
    data = text.encode()
    relative = entry_name(kind, hashlib.sha256(data).hexdigest(), suffix)

    def problem(path: str) -> str | None:
        with open(path, "rb") as handle:
            return None if handle.read() == data else "its content is not the text it is named after"

    return lookup(relative, problem) or store(relative, data)


# ---- sealed entries: a binary followed by a trailer naming its key and its own hash ----

_SEAL_MAGIC = b"\0kiln-sealed-entry-v1\0"
_SEAL_SIZE = len(_SEAL_MAGIC) + 32 + 32 + 8  # magic, key digest, body digest, body length


def seal(body: bytes, key_digest: str) -> bytes:
    """`body` with a trailer saying which key it was built for and what its bytes hash to.
    A shared library may carry trailing bytes: the dynamic loader maps only what its headers name."""
    return (body + _SEAL_MAGIC + bytes.fromhex(key_digest) + hashlib.sha256(body).digest()
            + len(body).to_bytes(8, "little"))


def check_sealed(path: str, key_digest: str) -> str | None:
    """What is wrong with the sealed entry at `path` for `key_digest` (None: it is whole and that key's)."""
    with open(path, "rb") as handle:
        data = handle.read()
    if len(data) < _SEAL_SIZE or data[-_SEAL_SIZE:-72] != _SEAL_MAGIC:
        return "it has no kiln seal (truncated, corrupt, or from an older kiln)"
    trailer = data[-72:]
    body = data[:-_SEAL_SIZE]
    if int.from_bytes(trailer[64:], "little") != len(body):
        return "it is truncated or extended"
    if trailer[:32] != bytes.fromhex(key_digest):
        return "it was built for another key (swapped or moved)"
    if trailer[32:64] != hashlib.sha256(body).digest():
        return "its bytes do not match their hash (corrupt)"
    return None


def unseal(path: str) -> bytes:
    """The body of the sealed entry at `path` (check it with `check_sealed` first)."""
    with open(path, "rb") as handle:
        return handle.read()[:-_SEAL_SIZE]


# ---- records: small JSON objects holding their key ----

def load_record(relative: str, key: str, fields: dict) -> dict | None:
    """The record `relative` when it holds `key` and each of `fields` (name -> type), else None."""
    found: dict = {}

    def problem(path: str) -> str | None:
        with open(path, "rb") as handle:
            record = json.loads(handle.read().decode())
        if not isinstance(record, dict) or record.get("key") != key:
            return "it is not a record for this key"
        for name, kind in fields.items():
            if not isinstance(record.get(name), kind):
                return f"its field {name!r} is missing or not a {kind.__name__}"
        found.update(record)
        return None

    return found if lookup(relative, problem) else None


def store_record(relative: str, key: str, record: dict) -> str:
    """Write `record` with its `key` as the entry `relative` (see `store`)."""
    return store(relative, json.dumps({"key": key, **record}, sort_keys=True).encode())


# ---- the cache as a whole: what `kiln cache info|clear` shows and removes ----

def usage(root: str | None = None) -> dict:
    """{kind: (entries, bytes)} of the cache dir `root` (default: config.cache_dir), one row per
    top-level folder (triton, cpp, wrappers...); files outside a folder are counted under "other".
    A missing cache dir is empty."""
    root = config.cache_dir if root is None else root
    kinds: dict = {}
    if not os.path.isdir(root):
        return kinds
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        kind = name if os.path.isdir(path) and not os.path.islink(path) else "other"
        entries, size = kinds.get(kind, (0, 0))
        for file_path in _files_under(path):
            entries, size = entries + 1, size + _size(file_path)
        kinds[kind] = (entries, size)
    return kinds


def clear(root: str | None = None) -> dict:
    """Remove everything inside the cache dir `root` (default: config.cache_dir), keeping the folder
    itself; what was removed, as `usage` counts it. Processes running meanwhile rebuild what they miss."""
    root = config.cache_dir if root is None else root
    removed = usage(root)
    if os.path.isdir(root):
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
    return removed


def _files_under(path: str):
    if not os.path.isdir(path) or os.path.islink(path):
        yield path
        return
    for folder, _, files in os.walk(path):
        for name in files:
            yield os.path.join(folder, name)


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0
