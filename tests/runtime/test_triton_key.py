"""Triton's cache-key prefix remembered in kiln's cache (kiln/runtime/compile_workers.py remember_triton_key):
the key Triton would compute, taken from the cache while Triton's files are unchanged, computed again when
they change, and handed to the compile worker processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import triton.runtime.cache

import kiln
from kiln import _triton
from kiln.runtime import compile_workers


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not remembered the key yet, Triton's own triton_key restored after the test."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(compile_workers, "_triton_key_thread", None)
    monkeypatch.setattr(compile_workers, "_triton_key", None)
    monkeypatch.setattr(triton.runtime.cache, "triton_key", triton.runtime.cache.triton_key)
    with kiln.config.patch(cache_dir=str(tmp_path)):
        yield tmp_path


def _new_process(monkeypatch, original):
    monkeypatch.setattr(compile_workers, "_triton_key_thread", None)
    monkeypatch.setattr(compile_workers, "_triton_key", None)
    monkeypatch.setattr(triton.runtime.cache, "triton_key", original)


def test_the_remembered_key_is_tritons_and_a_second_process_does_not_compute_it(fresh, monkeypatch):
    original = triton.runtime.cache.triton_key
    expected = original()
    compile_workers.remember_triton_key()  # on a thread of its own: triton_key() waits for it
    assert compile_workers.triton_key() == expected and triton.runtime.cache.triton_key() == expected
    assert list(fresh.glob("triton-key/*/*.json"))

    _new_process(monkeypatch, original)
    computed = []
    monkeypatch.setattr(_triton, "computed_triton_key", lambda: computed.append(1) or "computed again")
    assert compile_workers.triton_key() == expected and not computed
    assert triton.runtime.cache.triton_key() == expected


def test_a_change_to_tritons_files_computes_the_key_again(fresh, monkeypatch):
    original = triton.runtime.cache.triton_key
    compile_workers.triton_key()
    _new_process(monkeypatch, original)
    monkeypatch.setattr(_triton, "triton_key_stamp", lambda: "another triton")
    monkeypatch.setattr(_triton, "computed_triton_key", lambda: "recomputed")
    assert compile_workers.triton_key() == "recomputed" and triton.runtime.cache.triton_key() == "recomputed"


def test_the_stamp_is_cheap_and_names_tritons_library():
    start = time.perf_counter()
    stamp = _triton.triton_key_stamp()
    assert time.perf_counter() - start < 0.5
    assert "libtriton" in stamp and stamp == _triton.triton_key_stamp()


def test_a_failure_leaves_triton_to_compute_its_key(fresh, monkeypatch, caplog):
    original = triton.runtime.cache.triton_key
    monkeypatch.setattr(_triton, "triton_key_stamp", lambda: 1 / 0)
    assert compile_workers.triton_key() is None
    assert triton.runtime.cache.triton_key is original
    assert "could not be remembered" in caplog.text


def test_interpreted_kernels_need_no_key(fresh, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert compile_workers.triton_key() is None and compile_workers._triton_key_thread is None


def test_a_compile_worker_takes_the_parents_key_from_its_job():
    """The worker installs the job's key before compiling (this job then fails: it names no function)."""
    script = ("import runpy, sys; worker = runpy.run_path(sys.argv[1]); "
              "job = {'triton_key': \"the parent's key\", 'path': '<job>', 'text': '', 'module': 'm', 'function': 'f'}\n"
              "try:\n    worker['_compile'](job)\nexcept AttributeError:\n    pass\n"
              "import triton.runtime.cache as c; print(c.triton_key())")
    result = subprocess.run([sys.executable, "-c", script, os.path.join(os.path.dirname(compile_workers.__file__),
                            "compile_worker_main.py")], capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().strip().endswith("the parent's key")


def test_each_job_sent_to_a_worker_carries_the_key(fresh, monkeypatch):
    sent = []

    class Worker:
        process = None

        def __init__(self, warm_up_target=None):
            pass

        def run(self, job, timeout):
            sent.append(job)
            return True, ""

    pool = compile_workers.CompileWorkers(1)
    monkeypatch.setattr(compile_workers, "_Worker", Worker)
    monkeypatch.setattr(compile_workers, "_current_target", lambda: None)
    assert pool.compile({"path": "k.py"})
    assert sent == [{"path": "k.py", "triton_key": triton.runtime.cache.triton_key()}]
