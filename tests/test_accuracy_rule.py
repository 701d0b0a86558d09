"""kiln.testing.compare, the accuracy rule every test and benchmark uses: special values."""
from __future__ import annotations

import torch

from kiln.testing import compare

INF, NAN = float("inf"), float("nan")


def test_nan_and_inf_must_sit_where_eagers_are():
    eager = torch.tensor([1.0, NAN, INF])
    assert compare([torch.tensor([1.0, NAN, INF])], [eager]).ok
    assert not compare([torch.tensor([1.0, 2.0, INF])], [eager]).ok  # lost eager's NaN
    assert not compare([torch.tensor([NAN, NAN, INF])], [eager]).ok  # a NaN eager does not have
    assert not compare([torch.tensor([1.0, NAN, -INF])], [eager]).ok  # the other infinity


def test_float64s_special_value_is_accepted_where_eagers_differs():
    # gelu(+inf): eager's float kernel gives NaN on some CPUs, float64 gives inf; kiln's inf is accepted
    eager, reference = torch.tensor([1.0, NAN]), torch.tensor([1.0, INF], dtype=torch.float64)
    assert compare([torch.tensor([1.0, INF])], [eager], [reference]).ok
    assert compare([torch.tensor([1.0, NAN])], [eager], [reference]).ok  # eager's is accepted too
    assert not compare([torch.tensor([1.0, -INF])], [eager], [reference]).ok  # neither one's
    assert not compare([torch.tensor([1.0, 3.0])], [eager], [reference]).ok  # a finite value: neither
    # without a reference, eager's special values are the only ones accepted
    assert not compare([torch.tensor([1.0, INF])], [eager]).ok
    # where float64's value is finite, eager's NaN must be kept (kiln must not be "more right" silently)
    assert not compare([torch.tensor([1.0, 2.0])], [eager], [torch.tensor([1.0, 2.0], dtype=torch.float64)]).ok


def test_a_finite_float64_value_is_accepted_where_eager_overflowed():
    # float32 sinh(-89): eager's vectorized kernel gives -inf, float64's -2.2e38 fits float32; kiln's float64 value is accepted
    reference = torch.sinh(torch.tensor([1.0, -89.0], dtype=torch.float64))
    eager = torch.tensor([float(reference[0]), -INF])
    assert compare([reference.float()], [eager], [reference]).ok
    assert compare([eager.clone()], [eager], [reference]).ok  # eager's inf stays accepted
    assert not compare([torch.tensor([float(reference[0]), float(reference[1]) * 0.9])], [eager], [reference]).ok  # finite but not float64's
    assert not compare([torch.tensor([float(reference[0]), INF])], [eager], [reference]).ok  # the other inf
    assert not compare([reference.float()], [eager]).ok  # without a reference: eager's inf only
