"""kiln's on-disk caches (kiln/runtime/cache.py, cpp_build.py, loader.py) never trust a bad entry
and never fail a compile for one.

Every kind of entry (C++ libraries, the toolchain record, Triton kernels, wrappers) is made
corrupt, truncated, empty, `{}`, swapped with its neighbours, or unwritable; each case must end
in a rebuild (or a run from a private folder), with at most a warning per entry, kiln's kernels
compiled (strict mode: no eager fallback), and results that pass kiln's accuracy rule. Tampering
is done on a copy of a filled cache, so the libraries it holds are new paths to the dynamic
loader, as they are to a new process; two real processes fill one empty cache at once.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest
import torch

import kiln
import kiln.testing
from kiln.runtime import cache, cpp_build, loader
from tests.backend.test_pipeline import compiled_graphs

# Programs whose kernels all take one input and one output of one static size: a library
# swapped for another's is called without a signature mismatch, so only its check can catch it.
PROGRAMS = [lambda x: torch.sin(x) * 3 + 1, lambda x: torch.cos(x) * 2 - 1, lambda x: torch.exp(-x.abs()) * 0.5]


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """A process that has warned about nothing and loaded nothing yet."""
    monkeypatch.setattr(cache, "_warned", set())
    monkeypatch.setattr(cache, "_fallback_roots", {})
    forget_loaded()
    yield
    forget_loaded()


def forget_loaded() -> None:
    """Forget the kernels, libraries and toolchain this process loaded, as a new process would."""
    loader._loaded_kernels.clear()
    cpp_build._loaded.clear()
    cpp_build._toolchain_for.cache_clear()


def run_programs(cache_dir, backends=("cpp", "triton")) -> None:
    """Compile and run PROGRAMS with `cache_dir` on both CPU backends: kiln's kernels, results by kiln's rule."""
    x = torch.randn(40, 33)
    for backend in backends:
        with kiln.config.patch(cache_dir=str(cache_dir), cpu_backend=backend):
            for fn in PROGRAMS:
                result, graphs = compiled_graphs(fn, x)
                assert [graph.kernel_count for graph in graphs] == [1], backend
                verdict = kiln.testing.compare(result, fn(x), fn(x.double()))
                assert verdict, f"{backend}: {verdict.message}"


def entry_files(root) -> list:
    return sorted(os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names)


def assert_every_entry_is_valid(root) -> None:
    """Each file is whole and named by its key: what a later process would trust."""
    files = entry_files(root)
    assert files
    for path in files:
        name = os.path.basename(path)
        with open(path, "rb") as handle:
            data = handle.read()
        if name.endswith(".so"):
            assert cache.check_sealed(path, name[1:-3]) is None, path
        elif name.startswith("toolchain-"):
            record = json.loads(data)
            assert {"key", "version", "openmp", "vector_math"} <= set(record), path
        else:
            assert hashlib.sha256(data).hexdigest() == name[1:-3], path


def invalid_entry_warnings(records) -> list:
    return [record.getMessage() for record in records if "is invalid" in record.getMessage()]


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory):
    """A cache that PROGRAMS filled on both backends (each test tampers with a copy of it)."""
    folder = tmp_path_factory.mktemp("filled") / "cache"
    forget_loaded()  # so the toolchain record is written there too, whatever ran before
    run_programs(folder)
    return folder


@pytest.fixture
def copy(filled_cache, tmp_path):
    """A copy of the filled cache: its libraries are new paths to the dynamic loader, as for a new process."""
    shutil.copytree(filled_cache, tmp_path / "copy")
    return tmp_path / "copy"


def rotate(paths: list) -> None:
    """Each entry gets the next one's bytes, and so does each file beside it named after it (a
    digest `<entry>.sha256`, say): entries swapped together with whatever vouches for them."""
    companions = [[name for name in sorted(os.listdir(os.path.dirname(path)))
                   if name.startswith(os.path.basename(path)) and name != os.path.basename(path)] for path in paths]
    suffixes = {name[len(os.path.basename(path)):] for path, names in zip(paths, companions) for name in names}
    for group in [paths] + [[path + suffix for path in paths] for suffix in sorted(suffixes)]:
        contents = [open(path, "rb").read() for path in group]
        for path, data in zip(group, contents[1:] + contents[:1]):
            with open(path, "wb") as handle:
                handle.write(data)


TAMPERINGS = {
    "garbage": lambda data: b"\xff\xfe\x00not utf-8, not ELF, not JSON\x80" * 40,
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "empty_json_object": lambda data: b"{}",
    "one_flipped_byte": lambda data: data[:-200] + bytes([data[-200] ^ 0x55]) + data[-199:] if len(data) > 200
    else data + b"\x00",
}


@pytest.mark.parametrize("tampering", sorted(TAMPERINGS))
def test_every_bad_entry_is_rebuilt_and_warned_about_once(copy, tampering, caplog):
    files = entry_files(copy)
    for path in files:
        with open(path, "rb") as handle:
            data = handle.read()
        with open(path, "wb") as handle:
            handle.write(TAMPERINGS[tampering](data))
    with caplog.at_level("WARNING", logger="kiln"):
        run_programs(copy)
        forget_loaded()
        run_programs(copy)  # the rebuilt entries are trusted: no second warning
    warnings = invalid_entry_warnings(caplog.records)
    assert 0 < len(warnings) <= len(files) and len(set(warnings)) == len(warnings)
    assert_every_entry_is_valid(copy)


def test_swapped_entries_are_rebuilt_not_loaded(copy):
    for kind, suffix in [("wrappers", ".py"), ("cpp", ".so"), ("triton", ".py")]:
        entries = [path for path in entry_files(os.path.join(copy, kind)) if path.endswith(suffix)]
        assert len(entries) >= 2
        rotate(entries)
    run_programs(copy)
    assert_every_entry_is_valid(copy)


def test_a_library_is_checked_against_its_key_before_it_is_loaded(copy, monkeypatch):
    libraries = [path for path in entry_files(copy) if path.endswith(".so")]
    assert len(libraries) == len(PROGRAMS)
    rotate(libraries)
    mtimes = {path: os.stat(path).st_mtime_ns for path in libraries}
    opened = {}  # library path -> what was wrong with it when it was opened
    real_cdll = cpp_build.ctypes.CDLL

    def checked_cdll(path, *rest, **options):
        if str(path).startswith(str(copy)):
            opened[path] = cache.check_sealed(path, os.path.basename(path)[1:-3])
        return real_cdll(path, *rest, **options)

    monkeypatch.setattr(cpp_build.ctypes, "CDLL", checked_cdll)
    run_programs(copy, backends=["cpp"])
    assert opened == {path: None for path in libraries}  # each opened once, and only once it was whole and its own
    assert all(os.stat(path).st_mtime_ns != mtimes[path] for path in libraries)


def test_a_toolchain_record_of_another_key_or_without_its_fields_is_detected_again(copy):
    (record,) = [path for path in entry_files(copy) if os.path.basename(path).startswith("toolchain-")]
    with kiln.config.patch(cache_dir=str(copy)):
        genuine = cpp_build.toolchain()
        for planted in ({}, {"version": "planted 0.1", "openmp": not genuine.openmp, "vector_math": False},
                        {"key": "another compiler", "version": "planted 0.1", "openmp": False, "vector_math": False}):
            with open(record, "w") as handle:
                json.dump(planted, handle)
            forget_loaded()
            assert cpp_build.toolchain() == genuine
    run_programs(copy, backends=["cpp"])


def make_read_only(folder, monkeypatch) -> None:
    """`folder` and everything in it read-only; for root, whom modes do not stop, writes under it
    raise PermissionError as they would for anyone else."""
    for path in [str(folder), *entry_files(folder), *(os.path.join(d, n) for d, ns, _ in os.walk(folder) for n in ns)]:
        os.chmod(path, os.stat(path).st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    if os.geteuid() != 0:
        return
    inside = lambda path: os.path.commonpath([os.path.abspath(path), os.path.abspath(folder)]) == \
        os.path.abspath(folder)  # noqa: E731
    real_mkstemp, real_makedirs = tempfile.mkstemp, os.makedirs

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and inside(dir):
            raise PermissionError(13, "Permission denied", dir)
        return real_mkstemp(*args, dir=dir, **kwargs)

    def makedirs(path, *args, **kwargs):
        if inside(path) and not os.path.isdir(path):
            raise PermissionError(13, "Permission denied", path)
        return real_makedirs(path, *args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(os, "makedirs", makedirs)


def restore_writable(folder) -> None:
    for path in [str(folder), *(os.path.join(d, n) for d, ns, fs in os.walk(folder) for n in ns + fs)]:
        os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)


@pytest.mark.parametrize("where", ["under_a_file", "a_file", "read_only_folder"])
def test_an_unwritable_cache_dir_compiles_from_a_private_folder_with_one_warning(tmp_path, where, monkeypatch,
                                                                                 caplog):
    (tmp_path / "file").write_text("not a folder")  # a path under it: NotADirectoryError, as for root too
    cache_dir = {"under_a_file": tmp_path / "file" / "cache", "a_file": tmp_path / "file",
                 "read_only_folder": tmp_path / "cache"}[where]
    if where == "read_only_folder":
        cache_dir.mkdir()
        make_read_only(cache_dir, monkeypatch)
    try:
        with caplog.at_level("WARNING", logger="kiln"):
            run_programs(cache_dir)
    finally:
        if where == "read_only_folder":
            restore_writable(cache_dir)
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1 and "cannot write the cache dir" in warnings[0], warnings
    assert not os.path.isdir(cache_dir) or entry_files(cache_dir) == []


def test_a_read_only_cache_that_holds_the_entries_is_used_as_it_is(copy, monkeypatch, caplog):
    before = {path: os.stat(path).st_mtime_ns for path in entry_files(copy)}
    make_read_only(copy, monkeypatch)
    try:
        with caplog.at_level("WARNING", logger="kiln"):
            run_programs(copy)
    finally:
        restore_writable(copy)
    assert [record.getMessage() for record in caplog.records if record.levelname == "WARNING"] == []
    assert {path: os.stat(path).st_mtime_ns for path in entry_files(copy)} == before


_CHILD = """
import sys, torch, kiln, kiln.testing
from kiln.frontend import stats
programs = [lambda x: torch.sin(x) * 3 + 1, lambda x: torch.cos(x) * 2 - 1, lambda x: torch.exp(-x.abs()) * 0.5]
x = torch.randn(40, 33, generator=torch.Generator().manual_seed(0))
backends = sys.argv[1:]
for backend in backends:
    with kiln.config.patch(cpu_backend=backend):
        for fn in programs:
            verdict = kiln.testing.compare(kiln.compile(fn)(x), fn(x), fn(x.double()))
            assert verdict, (backend, verdict.message)
assert stats.graphs == len(programs) * len(backends) and stats.eager_frames == 0, stats
print("all compiled and correct")
"""


def start_child(cache_dir, *backends) -> subprocess.Popen:
    """A new process compiling PROGRAMS (strict: no eager fallback) on `backends` with `cache_dir`."""
    root = os.path.dirname(os.path.dirname(kiln.__file__))
    environment = {**os.environ, "PYTHONPATH": root, "KILN_CACHE_DIR": str(cache_dir), "KILN_STRICT": "1",
                   "TRITON_INTERPRET": "1"}
    return subprocess.Popen([sys.executable, "-c", _CHILD, *backends], env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(child: subprocess.Popen) -> str:
    output, _ = child.communicate(timeout=600)
    assert child.returncode == 0 and "all compiled and correct" in output, output[-3000:]
    return output


def test_processes_share_one_cache(tmp_path, caplog):
    cache_dir = tmp_path / "cache"
    # Two processes fill one empty cache at once.
    first, second = start_child(cache_dir, "cpp", "triton"), start_child(cache_dir, "cpp", "triton")
    finish(first), finish(second)
    assert_every_entry_is_valid(cache_dir)
    libraries = [path for path in entry_files(cache_dir) if path.endswith(".so")]
    assert len(libraries) == len(PROGRAMS)
    # This process never loaded them: to it, as to a new process, they are new paths. Rotated,
    # they must be rebuilt, not loaded as another kernel's code.
    rotate(libraries)
    with caplog.at_level("WARNING", logger="kiln"):
        run_programs(cache_dir, backends=["cpp"])
    assert len(invalid_entry_warnings(caplog.records)) == len(PROGRAMS)
    assert_every_entry_is_valid(cache_dir)
