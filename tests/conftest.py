"""Shared fixtures; shared helpers are in ``tests/helpers.py`` (``from helpers import ...``).

Test files live in sub-folders that mirror ``functrain/`` (``tests/transforms/``,
``tests/wrappers/``, ``tests/families/``, ``tests/parity/``); their basenames
are unique, so pytest's default import mode needs no ``__init__.py``. This file
puts ``tests/`` on ``sys.path`` so that every one of them can import ``helpers``.
"""

import os
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from helpers import make_params  # noqa: E402


@pytest.fixture
def params():
    return make_params()


@pytest.fixture(autouse=True, scope="module")
def _fresh_jit_cache():
    """Each test module starts with JAX's compilation caches empty.

    ``jax.jit``'s C++ cache holds at most 8192 live functions per process; in a pytest
    worker that has run a thousand tests it fills up, and from then on a new function's
    ``_cache_size()`` reads 0, which the tests that count compilations rely on (two of
    them failed that way under ``-n 2``; measured: 8,300 live jitted functions, then a new
    one called twice reports 0).
    """
    import jax
    jax.clear_caches()
    yield
