"""``import optax`` resolves to functrain: a pytest plugin (``-p functrain_as_optax``) for
``make clients``, which runs other projects' optax-using tests with functrain in optax's place.

Loaded with ``-p``, before any test module is imported (``pytest_configure``), it puts
functrain in ``sys.modules`` under the name ``optax``, and each of functrain's modules that
optax also has under optax's name (``optax.contrib``, ``optax.losses``, ``optax.tree``,
...), so that the project's own imports
(``import optax``, ``from optax import contrib``, flax's ``import optax`` inside
``flax.training``) get functrain. optax's modules that functrain does not mirror
(``optax.assignment``, ``optax.perturbations``, ...) are left unimportable, as they would be
without optax. ``FUNCTRAIN_OPTAX_TYPES=0`` is set first, so functrain does not import optax
(its classes are then plain NamedTuples): the run is functrain alone.

At the end of the session the plugin checks that ``optax`` still is functrain, and appends
``optax is functrain`` to the file named by ``FUNCTRAIN_CLIENTS_MARK``, which the runner
reads (so a run that silently used optax cannot pass for functrain's).
"""

from __future__ import annotations

import importlib
import os
import sys

# The modules both libraries have, under optax's names.
MIRRORED = ("contrib", "losses", "microbatching", "projections", "schedules", "transforms",
            "tree", "tree_utils")


def install() -> None:
    """Make ``import optax`` (and ``optax.<module>`` for :data:`MIRRORED`) give functrain."""
    os.environ["FUNCTRAIN_OPTAX_TYPES"] = "0"
    import functrain
    sys.modules["optax"] = functrain
    for name in MIRRORED:
        sys.modules[f"optax.{name}"] = importlib.import_module(f"functrain.{name}")


def pytest_configure(config):
    install()  # loaded with -p: before any test module is collected (imported)


def pytest_sessionfinish(session, exitstatus):
    import functrain
    mark = os.environ.get("FUNCTRAIN_CLIENTS_MARK")
    if mark and sys.modules.get("optax") is functrain:
        with open(mark, "a") as f:
            f.write("optax is functrain\n")
