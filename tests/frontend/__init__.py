"""Tests of kiln/frontend: bytecode round trip, the program corpus, guards, models."""
import pytest

# check() and _equal(), which test_python_{control_flow,generators,objects,library}.py share, assert as tests do:
# pytest rewrites their asserts too, for its messages
pytest.register_assert_rewrite("tests.frontend.python_features_support")
