"""The machinery of ``make clients`` (tests/clients/): the ``import optax`` alias, and the
runner's comparison, which must be able to fail.

``make clients`` itself (flax's and optimistix's tests, twice each) runs in CI as its own
step; these checks are the quick part of it that make test can afford.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
CLIENTS = ROOT / "tests" / "clients"
sys.path.insert(0, str(CLIENTS))

import run_clients  # noqa: E402

ALIASED = """
import sys
import functrain_as_optax
functrain_as_optax.install()  # as its pytest_configure does under pytest's -p
import optax
from optax import contrib, losses
import optax.tree
import functrain
print(optax is functrain, contrib is functrain.contrib, losses is functrain.losses,
      optax.tree is functrain.tree, any(m.__name__.startswith('optax') for m in
      sys.modules.values() if getattr(m, '__name__', None)))
"""


def test_import_optax_gives_functrain_and_never_optax():
    env = dict(os.environ, PYTHONPATH=str(CLIENTS))
    out = subprocess.run([sys.executable, "-c", ALIASED], capture_output=True, text=True,
                         timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    # optax is functrain, module by module, and no module of the real optax was imported.
    assert out.stdout.split() == ["True", "True", "True", "True", "False"]


def run(outcomes: dict, values: dict = None) -> dict:
    return {"outcomes": outcomes, "values": values or {}}


def test_the_comparison_finds_outcome_and_value_differences():
    same = run({"a::t1": "passed", "a::t2": "skipped"}, {"a::t1": [[1.0, 2.0]]})
    assert run_clients.compare("s", same, same) == []
    other = run({"a::t1": "failed", "a::t3": "passed"}, {"a::t1": [[1.0, 2.0000001]]})
    found = {(d["test"], d["optax"], d["functrain"])
             for d in run_clients.compare("s", same, other)}
    assert found == {("a::t1", "passed", "failed"), ("a::t2", "skipped", "absent"),
                     ("a::t3", "absent", "passed"), ("a::t1", "values", "other values")}


def test_the_reduced_selection_is_the_tests_that_mention_optax(tmp_path):
    path = tmp_path / "some_test.py"
    path.write_text(textwrap.dedent("""
        import optax

        class T:
            def test_uses(self):
                return optax.adam(0.1)

            def test_does_not(self):
                return 1

        def test_plain():
            return optax.sgd
        def helper():
            return optax.sgd
    """))
    assert run_clients.tests_mentioning_optax(path) == ["test_plain", "test_uses"]


def test_the_list_of_differences_reads():
    assert isinstance(run_clients.load_differences(), list)
