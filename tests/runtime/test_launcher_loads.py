"""Triton's launchers loaded as the files asked for (kiln/_triton.py `load_extension_module`): glibc's dlopen
returns a library it already holds when a new file has that library's inode number, which a launcher file that
was replaced can give out again; kiln then loads a copy. A hard link is a second path to one inode: the same
case, made on purpose."""
from __future__ import annotations

import os
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


def _launcher_like(count: int, salt: str) -> str:
    """A module shaped like Triton's launcher: `launch` takes exactly `count` arguments and returns `count`."""
    return SOURCE % {"declarations": " ".join(f"PyObject* a{k};" for k in range(count)), "format": "O" * count,
                     "references": "".join(f", &a{k}" for k in range(count)), "count": count, "salt": salt}


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return tmp_path


def test_triton_loads_launchers_through_kiln():
    assert build._load_module_from_path is _triton.load_extension_module


def test_a_second_path_to_a_loaded_library_loads_a_copy_of_its_own(cache):
    first = build.compile_module_from_src(_launcher_like(3, f"first {cache}"), "__triton_launcher")
    assert first.launch(1, 2, 3) == 3
    alias = cache / "alias" / "__triton_launcher.so"
    alias.parent.mkdir()
    os.link(first.__file__, alias)  # a new path to the loaded library's inode: dlopen returns that library
    assert _triton.loaded_library_path(str(alias)) == os.path.realpath(first.__file__)

    module = _triton.load_extension_module("__triton_launcher", str(alias))

    assert module.__file__ != first.__file__ and os.path.dirname(module.__file__) == str(alias.parent)
    assert _triton.loaded_library_path(module.__file__) == os.path.realpath(module.__file__)
    assert module.launch(1, 2, 3) == 3


def test_launchers_loaded_on_many_threads_are_each_their_own(cache):
    results, errors = {}, []

    def load(count: int) -> None:
        try:
            module = build.compile_module_from_src(_launcher_like(count, f"threads {cache}"), "__triton_launcher")
            results[count] = module.launch(*range(count))
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=load, args=(count,)) for count in range(1, 13)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and results == {count: count for count in range(1, 13)}
