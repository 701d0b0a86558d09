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
    monkeypatch.delenv("KILN_TRITON_KEY", raising=False)
    monkeypatch.setattr(compile_workers, "_triton_key_known", False)
    monkeypatch.setattr(triton.runtime.cache, "triton_key", triton.runtime.cache.triton_key)
    with kiln.config.patch(cache_dir=str(tmp_path)):
        yield tmp_path


def _new_process(monkeypatch, original):
    monkeypatch.setattr(compile_workers, "_triton_key_known", False)
    monkeypatch.setattr(triton.runtime.cache, "triton_key", original)


def test_the_remembered_key_is_tritons_and_a_second_process_does_not_compute_it(fresh, monkeypatch):
    original = triton.runtime.cache.triton_key
    expected = original()
    compile_workers.remember_triton_key()
    assert triton.runtime.cache.triton_key() == expected and os.environ["KILN_TRITON_KEY"] == expected
    assert list(fresh.glob("triton-key/*/*.json"))

    _new_process(monkeypatch, original)
    monkeypatch.setattr(_triton, "computed_triton_key", lambda: pytest.fail("the key was computed again"))
    compile_workers.remember_triton_key()
    assert triton.runtime.cache.triton_key() == expected


def test_a_change_to_tritons_files_computes_the_key_again(fresh, monkeypatch):
    original = triton.runtime.cache.triton_key
    compile_workers.remember_triton_key()
    _new_process(monkeypatch, original)
    monkeypatch.setattr(_triton, "triton_key_stamp", lambda: "another triton")
    monkeypatch.setattr(_triton, "computed_triton_key", lambda: "recomputed")
    compile_workers.remember_triton_key()
    assert triton.runtime.cache.triton_key() == "recomputed"


def test_the_stamp_is_cheap_and_names_tritons_library():
    start = time.perf_counter()
    stamp = _triton.triton_key_stamp()
    assert time.perf_counter() - start < 0.5
    assert "libtriton" in stamp and stamp == _triton.triton_key_stamp()


def test_a_failure_leaves_triton_to_compute_its_key(fresh, monkeypatch, caplog):
    original = triton.runtime.cache.triton_key
    monkeypatch.setattr(_triton, "triton_key_stamp", lambda: 1 / 0)
    compile_workers.remember_triton_key()
    assert triton.runtime.cache.triton_key is original
    assert "could not be remembered" in caplog.text


def test_a_compile_worker_takes_the_parents_key():
    script = ("import runpy, sys, io; worker = runpy.run_path(sys.argv[1]); worker['main'](); "
              "import triton.runtime.cache as c; print(c.triton_key(), file=sys.stderr)")
    environment = dict(os.environ, KILN_TRITON_KEY="the parent's key")
    result = subprocess.run([sys.executable, "-c", script, os.path.join(os.path.dirname(compile_workers.__file__),
                            "compile_worker_main.py")], input=b"", capture_output=True, env=environment, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr.decode().strip().endswith("the parent's key")
