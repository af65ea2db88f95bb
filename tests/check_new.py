"""The checks of one optimizer, new or changed: ``make check-new NAME=<optimizer>``.

Runs, in three pytest invocations:

1. its own test files (those under ``tests/`` whose file name contains the name, e.g.
   ``tests/contrib/test_contrib_laprop.py``, and the one its registry record names), long
   cases included;
2. the whole-package checks a new optimizer can break (``make test``'s part of them): its
   declaration and the registry's (``test_declarations.py``, ``test_registry.py``), the
   public API's docstrings and examples (``test_public_api.py``), the optax coverage
   (``test_optax_coverage.py``) and the docs' generated tables (``test_docs.py``);
3. the registry-wide suites, long cases included, restricted to its cases (``-k NAME``: every optimizer is a
   parameter there): properties, dtypes, ``inject_hyperparams``, Orbax round trips, the
   interchange with optax, parity and bit identity, Equinox, the hyperparameter reader.

``-k`` matches substrings, so ``NAME=adam`` also runs ``adamw``'s and ``nadam``'s cases.
Usage: ``python tests/check_new.py NAME [-n WORKERS]``; exit status 0 when all pass.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent
WHOLE = ["test_declarations.py", "test_registry.py", "test_public_api.py",
         "test_optax_coverage.py", "test_docs.py"]
REGISTRY_SUITES = ["test_properties.py", "test_checkpoint_sweep.py", "test_hyperparams_reader.py",
                   "test_equinox_closures.py", "parity", "contrib/test_common.py"]


def own_files(name: str) -> list[str]:
    """The test files whose file name holds ``name`` (as ``test_contrib_<name>.py``), and the
    file its registry record names for its numpy reference (``muonh``: the hyperball file)."""
    found = {str(p.relative_to(TESTS.parent)) for p in TESTS.rglob("test_*.py")
             if name in p.stem}
    sys.path.insert(0, str(TESTS))
    import registry  # noqa: E402  (tests/ on the path, as pytest puts it)
    record = registry.REGISTRY.get(name)
    reference = record.reference.rpartition(" in ")[2] if record else ""
    if reference.startswith("tests/") and (TESTS.parent / reference).is_file():
        found.add(reference)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("-n", type=int, default=2)
    args = parser.parse_args(argv)
    own = own_files(args.name)
    if not own:
        print(f"check-new: no test file under tests/ has {args.name!r} in its name; write "
              f"one (docs/design.md, 'Adding an optimizer').")
        return 2
    pytest = [sys.executable, "-m", "pytest", "-q", "-n", str(args.n), "-m"]
    here = TESTS.relative_to(TESTS.parent)
    runs = [pytest + ["long or not long"] + own,
            pytest + ["not long"] + [str(here / f) for f in WHOLE],  # not the docs build
            pytest + ["long or not long", "-k", args.name]
            + [str(here / f) for f in REGISTRY_SUITES]]
    status = 0
    for cmd in runs:
        print("+ " + " ".join(cmd[1:]), flush=True)
        done = subprocess.run(cmd, cwd=TESTS.parent)
        # pytest's 5: no test collected (an optimizer outside the registry's suites)
        status = status or (done.returncode if done.returncode != 5 else 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
