"""The contrib optimizers every common check runs on: one ``Case`` per setting.

``tests/contrib/test_common.py`` runs each case against ``optax.contrib`` (same
numbers step by step on a tree of matrices, vectors, a scalar and a zero leaf),
and checks what optax's own contrib conformance tests check: the parabola,
Rosenbrock and mixed-tensor problems go where optax's go, ``inject_hyperparams``
changes no number, dtypes are kept, ``MultiSteps`` equals the large batch, and
``jax.eval_shape(opt.init, ...)`` works from shapes alone.
``tests/sharding_checks.py`` runs every case on 8 simulated devices (the state
follows the parameters' sharding).

A case's ``make(lib)`` builds the transformation from ``lib``, which is either the
``functrain`` or the ``optax`` package (so ``lib.contrib.X`` is the optimizer under
test and ``lib.sgd`` a base optimizer for the wrappers). ``extra(loss_fn, params)``
gives the keyword arguments ``update`` needs besides the gradients (``value=`` for
momo and reduce_on_plateau, ``obj_fn=`` for sophia, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax


@dataclasses.dataclass(frozen=True)
class Case:
    """One setting of one contrib optimizer (or wrapper)."""

    covers: str                                  # the optax.contrib name it tests
    make: Callable[[Any], Any]                   # lib -> GradientTransformation
    extra: Optional[Callable[[Callable, Any], dict]] = None  # (loss_fn, params) -> kwargs
    # Checks of test_common.py this case leaves out, each with the reason, e.g.
    # {"multisteps": "sam's update is not a function of the gradient alone"}.
    not_in: dict = dataclasses.field(default_factory=dict)
    # The optax.contrib factory takes its hyperparameters by keyword, so that
    # inject_hyperparams(lib.contrib.<covers>)(**kwargs) can be compared.
    kwargs: Optional[dict] = None


def value_of(loss_fn: Callable, params: Any) -> dict:
    """``extra`` for optimizers that take the loss value: ``{'value': loss_fn(params)}``."""
    return {"value": loss_fn(params)}


def loss_function(loss_fn: Callable, params: Any) -> dict:
    """``extra`` for optimizers that take the objective itself: ``{'obj_fn': loss_fn}``."""
    del params
    return {"obj_fn": loss_fn}


def grad_function(loss_fn: Callable, params: Any) -> dict:
    """``extra`` for sam's opaque mode: ``{'grad_fn': (params, step) -> grads}``."""
    del params
    return {"grad_fn": lambda p, _: jax.grad(loss_fn)(p)}


def opt(name: str, extra: Optional[Callable] = None, not_in: Optional[dict] = None,
        **kwargs: Any) -> Case:
    """A case for ``lib.contrib.<name>(**kwargs)``."""
    return Case(name, lambda lib: getattr(lib.contrib, name)(**kwargs), extra,
                dict(not_in or {}), dict(kwargs))


CASES: dict[str, Case] = {}

# One block per family (kept apart so they can be written in parallel).  Key: a short
# description of the setting, e.g. "adopt(lr=1e-2)".
# [area: muon]
# [end area: muon]
# [area: schedule-free and parameter-free]
# [end area: schedule-free]
# [area: adam variants]
# [end area: adam variants]
# [area: extra-args optimizers and wrappers]
# [end area: extra-args]
