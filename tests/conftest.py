"""Shared fixtures; shared helpers are in ``tests/helpers.py`` (``from helpers import ...``).

Test files live in sub-folders that mirror ``functrain/`` (``tests/transforms/``,
``tests/wrappers/``, ``tests/families/``, ``tests/parity/``); their basenames
are unique, so pytest's default import mode needs no ``__init__.py``. This file
puts ``tests/`` on ``sys.path`` so that every one of them can import ``helpers``.
"""

import fcntl
import os
import pickle
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from helpers import make_params  # noqa: E402


# make clients' files (tests/clients/) run in their own pytest processes, with optax or with
# functrain installed as optax; the suite's doctest collection must not import them.
collect_ignore_glob = ["clients/*"]


# The test cases make test leaves to make test-long by measured duration (tests/
# plan_fast_suite.py writes the list; FUNCTRAIN_LONG_BY_DURATION=off ignores it, to measure).
LONG_BY_DURATION = os.path.join(TESTS, "long_by_duration.txt")


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Marks ``long`` the test cases listed in tests/long_by_duration.txt."""
    if os.environ.get("FUNCTRAIN_LONG_BY_DURATION") == "off" or not os.path.exists(
            LONG_BY_DURATION):
        return
    with open(LONG_BY_DURATION) as f:
        listed = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.long)


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


@pytest.fixture(scope="session")
def run_once(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """``run_once(key, fn)``: ``fn()``'s result, computed by one pytest-xdist worker and read
    by the others (pickled, behind a file lock in the run's shared temporary directory).

    For the module fixtures that run checks in fresh processes (8 simulated devices, two
    processes): under ``-n 2`` each worker that runs one of the module's tests would
    otherwise run the whole subprocess again (test_sharding's: 170 s). A failure is
    recorded too, and raised again in every worker, so a broken check is not run twice.
    """
    base = tmp_path_factory.getbasetemp()
    worker = getattr(request.config, "workerinput", None)  # set in pytest-xdist's workers only
    shared = (base.parent if worker is not None else base) / "run_once"
    shared.mkdir(exist_ok=True)

    def run(key: str, fn):
        result_file = shared / f"{key}.pickle"
        with open(shared / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait here, idle
            try:
                if not result_file.exists():
                    try:
                        outcome = ("ok", fn())
                    except Exception as e:  # noqa: BLE001 -- raised again below, everywhere
                        outcome = ("error", f"{type(e).__name__}: {e}")
                    result_file.write_bytes(pickle.dumps(outcome))
                status, value = pickle.loads(result_file.read_bytes())
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        if status == "error":
            raise AssertionError(f"run_once({key!r}) failed (in whichever worker ran it): "
                                 f"{value}")
        return value

    return run
