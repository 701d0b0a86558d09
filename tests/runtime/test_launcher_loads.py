"""Triton's launchers each loaded into a module object of the caller's own (kiln/_triton.py `load_extension_module`).

CPython hands a second load of a single-phase extension module's file the module object `sys.modules` holds under
its name: for Triton's launchers, all named `__triton_launcher`, the last launcher loaded. Triton reads `launch` off
the module after the load, so two threads loading launchers at once could each take the other's (ResNet-50 at
05ad837: "function takes exactly 21 arguments (27 given)")."""
from __future__ import annotations

import importlib.util
import sys
import threading

import pytest
from triton.runtime import build

from kiln import _triton

SOURCE = r"""
#include <Python.h>
static PyObject* launch(PyObject* self, PyObject* args) {
  %(declarations)s
  if (!PyArg_ParseTuple(args, "%(format)s"%(references)s)) return NULL;
  return PyLong_FromLong(%(count)d);
}
static PyMethodDef methods[] = {{"launch", launch, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "__triton_launcher", NULL, -1, methods};
PyMODINIT_FUNC PyInit___triton_launcher(void) { return PyModule_Create(&definition); }
/* %(salt)s */
"""


def launcher_like(count: int, salt: str) -> str:
    """C source shaped like a Triton launcher: `launch` takes exactly `count` arguments and returns `count`."""
    return SOURCE % {"declarations": " ".join(f"PyObject* a{k};" for k in range(count)), "format": "O" * count,
                     "references": "".join(f", &a{k}" for k in range(count)), "count": count, "salt": salt}


def pythons_loader(name: str, path: str):
    """Triton's own `_load_module_from_path`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return str(tmp_path)


def load(count: int, salt: str):
    return build.compile_module_from_src(launcher_like(count, salt), "__triton_launcher")


def test_triton_loads_launchers_through_kiln():
    assert build._load_module_from_path is _triton.load_extension_module


def test_python_shares_one_module_object_between_launcher_files(cache, monkeypatch):
    """Why kiln's loader exists: under Triton's own loader a launcher loaded again is the last one loaded, whose
    `launch` the next load overwrites. (If a Python stops doing this, the guard can go.)"""
    monkeypatch.setattr(build, "_load_module_from_path", pythons_loader)
    three, five = load(3, cache), load(5, cache)
    three_again = load(3, cache)
    assert three_again is five
    load(5, cache)
    with pytest.raises(TypeError, match="exactly 5 arguments"):
        three_again.launch(1, 2, 3)


def test_a_loaded_launcher_keeps_its_own_launch(cache):
    three, five = load(3, cache), load(5, cache)
    three_again = load(3, cache)
    load(5, cache)
    assert three_again is not five and three.launch(1, 2, 3) == three_again.launch(1, 2, 3) == 3
    assert five.launch(*range(5)) == 5


def wrong_launchers(threads: int, loads: int, salt: str) -> int:
    """How many of `threads` x `loads` loads of cached launchers (through whatever loader Triton has now), each
    launched at once, ran another launcher: each thread has its own launcher and loads it again and again while the
    interpreter switches threads as often as it can."""
    sources = {count: launcher_like(count, salt) for count in range(1, threads + 1)}
    for source in sources.values():
        build.compile_module_from_src(source, "__triton_launcher")
    wrong = []

    def work(count: int) -> None:
        for _ in range(loads):
            launch = build.compile_module_from_src(sources[count], "__triton_launcher").launch
            try:
                if launch(*range(count)) != count:
                    wrong.append(count)
            except TypeError:
                wrong.append(count)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=work, args=(count,)) for count in sources]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(interval)
    return len(wrong)


def test_launchers_loaded_again_on_many_threads_are_each_their_own(cache):
    """Six threads, 1,800 loads. Triton's own loader gave 0 to 39 wrong launchers here
    (2026-12-07, eight runs; 0 and 9-11 while another process kept both cores busy)."""
    assert wrong_launchers(6, 300, cache) == 0
