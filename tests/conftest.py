"""Shared fixtures; shared helpers are in ``tests/helpers.py`` (``from helpers import ...``).

Test files live in sub-folders that mirror ``functrain/`` (``tests/transforms/``,
``tests/wrappers/``, ``tests/optimizers/``, ``tests/parity/``); their basenames
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
