"""Bytecode round trip: decode -> assemble must reproduce what CPython compiled.

The corpus is every code object (functions, methods, comprehensions, lambdas, class
bodies, nested to any depth) in a set of standard-library modules and the transformers
modules kiln's model tests use (a few seconds). The `slow` test widens it to every
source file of the standard library, transformers and torch. A second test inserts
instructions to force offsets and EXTENDED_ARG prefixes to change and checks the
functions still behave the same.
"""
from __future__ import annotations

import importlib
import os
import types
import warnings

import pytest

from kiln.frontend import bytecode

CORPUS_MODULES = [
    "argparse", "ast", "collections", "dataclasses", "difflib", "enum", "functools", "inspect", "json.decoder",
    "json.encoder", "logging", "pathlib", "pickle", "re._compiler", "re._parser", "shutil", "string", "tarfile",
    "textwrap", "threading", "typing", "unittest.case", "zipfile", "email.message", "http.client",
    "transformers.modeling_utils", "transformers.masking_utils", "transformers.utils.generic",
    "transformers.configuration_utils", "transformers.models.bert.modeling_bert",
    "transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama",
    "torch.nn.modules.module", "torch.nn.functional",
]


def _code_objects(code: types.CodeType):
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_objects(constant)


def _module_code(name: str) -> types.CodeType:
    module = importlib.import_module(name)
    with open(module.__file__, encoding="utf-8") as handle:
        return compile(handle.read(), module.__file__, "exec")


def _assert_round_trip(code: types.CodeType) -> None:
    rebuilt = bytecode.assemble(bytecode.decode(code))
    where = f"{code.co_filename}:{code.co_firstlineno} {code.co_qualname}"
    assert rebuilt.co_code == code.co_code, where
    assert rebuilt.co_exceptiontable == code.co_exceptiontable, where
    assert list(rebuilt.co_positions()) == list(code.co_positions()), where


@pytest.mark.parametrize("module_name", CORPUS_MODULES)
def test_round_trip_reproduces_cpython_code(module_name):
    count = 0
    for code in _code_objects(_module_code(module_name)):
        _assert_round_trip(code)
        count += 1
    assert count > 10


def _source_files(root: str):
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(name for name in subdirectories if name not in ("site-packages", "__pycache__"))
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(directory, name)


@pytest.mark.slow
@pytest.mark.parametrize("package", ["stdlib", "transformers", "torch"])
def test_round_trip_over_every_source_file(package):
    """Every code object of every .py file under the package (stdlib: the whole Lib folder)."""
    root = os.path.dirname(os.__file__) if package == "stdlib" else os.path.dirname(
        importlib.import_module(package).__file__)
    files = codes = 0
    for path in _source_files(root):
        try:
            with open(path, encoding="utf-8") as handle, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # test data full of deliberate oddities
                module_code = compile(handle.read(), path, "exec", dont_inherit=True)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # test data with deliberately bad syntax or encodings
        files += 1
        for code in _code_objects(module_code):
            _assert_round_trip(code)
            codes += 1
    assert files > 100 and codes > 10_000, (files, codes)


def _padded(function, nops: int):
    """`function` with `nops` NOPs before every instruction: every jump and handler moves."""
    decoded = bytecode.decode(function.__code__)
    padded = []
    for instruction in decoded.instructions:
        if padded and (padded[-1].opname, instruction.opname) == ("PRECALL", "CALL"):
            padded.append(instruction)  # 3.11 needs these two adjacent
            continue
        padded.extend(bytecode.create_instruction("NOP", positions=instruction.positions) for _ in range(nops))
        padded.append(instruction)
    decoded.instructions = padded
    return types.FunctionType(bytecode.assemble(decoded), function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)


def _loops_and_handlers(items):
    total = 0
    for index, item in enumerate(items):
        try:
            total += 10 // item
        except ZeroDivisionError:
            total -= 1
        finally:
            total += index
        while total > 100:
            total //= 2
    squares = [value * value for value in items if value]
    with open(__file__) as handle:
        first = handle.read(3)
    return total, squares, first, {key: key * 2 for key in items}


@pytest.mark.parametrize("nops", [1, 40, 300])
def test_moved_instructions_behave_the_same(nops):
    # 300 NOPs per instruction makes most jumps need EXTENDED_ARG prefixes.
    padded = _padded(_loops_and_handlers, nops)
    for items in ([1, 2, 0, 5], [], [0, 0, 3, 7, 9, 11]):
        assert padded(items) == _loops_and_handlers(items)


def test_extended_args_count_is_minimal_after_round_trip():
    padded = _padded(_loops_and_handlers, 300)
    again = bytecode.assemble(bytecode.decode(padded.__code__))
    assert again.co_code == padded.__code__.co_code
    assert bytecode.max_stack_depth(bytecode.decode(padded.__code__)) <= padded.__code__.co_stacksize


def test_assemble_refuses_to_separate_adjacent_pairs():
    from kiln.frontend import versions

    if not versions.MUST_BE_ADJACENT:
        pytest.skip("no adjacency rules on this Python")
    decoded = bytecode.decode(_loops_and_handlers.__code__)
    index = next(i for i, instruction in enumerate(decoded.instructions) if instruction.opname == "PRECALL")
    decoded.instructions.insert(index + 1, bytecode.create_instruction("NOP"))
    with pytest.raises(ValueError, match="PRECALL must be followed directly by CALL"):
        bytecode.assemble(decoded)
