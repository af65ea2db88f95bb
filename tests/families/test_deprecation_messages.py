"""Deprecation warnings keep the words optax's own tests (and its users) search for.

Each entry is a call and the regex optax 0.2.8's test suite matches its warning with
(optax/_src/alias_test.py for optimistic_adam); functrain's longer message must match it
too, and so must optax's (so the regex is still the one optax uses).
"""

import optax
import pytest

import functrain

CASES = {
    "optimistic_adam": (lambda m: m.optimistic_adam(1e-3), "use `optimistic_adam_v2` instead"),
}


@pytest.mark.parametrize("lib", [functrain, optax], ids=["functrain", "optax"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_deprecation_message_matches_optax_regex(name, lib):
    make, regex = CASES[name]
    with pytest.warns(DeprecationWarning, match=regex):
        make(lib)
