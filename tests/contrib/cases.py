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
# optax's own contrib setting (lr=1e-2), then the switches that change the numbers. The
# tree's 2-D leaves go to Muon, the others to AdamW.
CASES["muon(lr=1e-2)"] = opt("muon", learning_rate=1e-2)
CASES["muon(nesterov=False)"] = opt("muon", learning_rate=1e-2, nesterov=False)
CASES["muon(adaptive=True)"] = opt("muon", learning_rate=1e-2, adaptive=True)
CASES["muon(aol, consistent_rms=0.2, weight_decay)"] = opt(
    "muon", learning_rate=1e-2, preconditioning="aol", consistent_rms=0.2, weight_decay=1e-3,
    adam_learning_rate=3e-2)
CASES["muon(dion coefficients, ns_steps=6)"] = opt(
    "muon", learning_rate=1e-2, ns_coeffs="dion", ns_steps=6)
# [end area: muon]
# [area: schedule-free and parameter-free]
# optax's own contrib settings (_common_test.py), plus a base optimizer with momentum-free
# Adam for mechanize. Wrappers take a base optimizer, so they have no kwargs for inject;
# tests/contrib/test_contrib_{schedule_free,parameter_free}.py inject their numbers.
CASES["schedule_free_sgd(lr=1e-2, warmup_steps=5000)"] = opt(
    "schedule_free_sgd", learning_rate=1e-2, warmup_steps=5000)
CASES["schedule_free_adamw(lr=1e-2, warmup_steps=5000)"] = opt(
    "schedule_free_adamw", learning_rate=1e-2, warmup_steps=5000)
CASES["schedule_free(sgd(1e-2), lr=1e-2)"] = Case(
    "schedule_free", lambda lib: lib.contrib.schedule_free(lib.sgd(1e-2), learning_rate=1e-2))
CASES["prodigy(lr=1e-1)"] = opt("prodigy", learning_rate=1e-1)
CASES["dadapt_adamw(lr=1e-1)"] = opt("dadapt_adamw", learning_rate=1e-1)
CASES["dog(lr=1.0)"] = opt("dog", learning_rate=1.0)
CASES["dowg(lr=1.0)"] = opt("dowg", learning_rate=1.0)
CASES["cocob()"] = opt("cocob")
CASES["cocob(weight_decay=1e-2)"] = opt("cocob", weight_decay=1e-2)
CASES["mechanize(sgd(1e-1), weight_decay=0)"] = Case(
    "mechanize", lambda lib: lib.contrib.mechanize(lib.sgd(1e-1), weight_decay=0.0))
CASES["mechanize(adam(1.0), weight_decay=0)"] = Case(
    "mechanize", lambda lib: lib.contrib.mechanize(lib.adam(1.0), weight_decay=0.0))
# [end area: schedule-free]
# [area: adam variants]
def _warmup(start: float, end: float, steps: int = 100) -> Callable:
    """A linear warm-up schedule (AdEMAMix's b3/alpha schedules), the same for both libs."""
    return lambda count: start + (end - start) * jax.numpy.minimum(count / steps, 1.0)


CASES["adopt(lr=1e-2)"] = opt("adopt", learning_rate=1e-2)
CASES["adopt(nesterov, b2=0.999)"] = opt("adopt", learning_rate=1e-2, nesterov=True, b2=0.999)
CASES["adopt(clip_value_fn=1)"] = opt("adopt", learning_rate=1e-2,
                                      clip_value_fn=lambda count: 1.0)
CASES["ademamix(lr=1e-3)"] = opt("ademamix", learning_rate=1e-3)
CASES["ademamix(b3, alpha schedules)"] = opt(
    "ademamix", learning_rate=1e-3, b3=_warmup(0.9, 0.999), alpha=_warmup(0.0, 5.0), b1=0.75)
CASES["simplified_ademamix(lr=1e-3)"] = opt("simplified_ademamix", learning_rate=1e-3)
CASES["simplified_ademamix(alpha schedule)"] = opt(
    "simplified_ademamix", learning_rate=1e-3, alpha=_warmup(0.0, 2.0), b1=0.9)
CASES["madgrad(lr=1e-2)"] = opt("madgrad", learning_rate=1e-2)
CASES["madgrad(momentum=0.5, lr=3e-2)"] = opt("madgrad", learning_rate=3e-2, momentum=0.5)
CASES["acprop(lr=1e-3)"] = opt("acprop", learning_rate=1e-3, not_in={
    "sharding": "ACProp divides g_t by |g_(t-1)| (eps=1e-16): on the 4x2 mesh the sharded "
                "gradient's reduction order changes its last bits, and that ratio amplifies "
                "them to 3.6e-5 relative on one entry after 3 steps (optax.contrib.acprop "
                "differs the same way there); the eps=1e-3 case checks the state's sharding"})
CASES["acprop(b1=0.5, eps=1e-3)"] = opt("acprop", learning_rate=1e-3, b1=0.5, eps=1e-3)
CASES["galore(lr=1e-2, rank=8)"] = opt("galore", learning_rate=1e-2, rank=8)
CASES["galore(rank=1, update_proj_gap=7, scale=0.5)"] = opt(
    "galore", learning_rate=1e-2, rank=1, update_proj_gap=7, scale=0.5)
CASES["normalize()"] = opt("normalize", not_in={
    "converges": "normalize is a building block with no step size: g / ||g|| is an "
                 "ascent direction of length 1, it does not descend to any target"})
# [end area: adam variants]
# [area: extra-args optimizers and wrappers]
def _sam(lib: Any, rho: float = 1e-3, normalized: bool = True, **kwargs: Any) -> Any:
    """SAM as optax's docs build it: an outer adam, and as the adversarial optimizer sgd of
    step rho on the normalized gradient (or on the raw gradient, ``normalized=False``)."""
    adv = lib.chain(lib.contrib.normalize(), lib.sgd(rho)) if normalized else lib.sgd(rho)
    return lib.contrib.sam(lib.adam(1e-2), adv, **kwargs)


def _per_example(lib: Any) -> Any:
    """Turns a gradient into a batch of 3 per-example gradients (g, 0.5 g, 2 g) on axis 0,
    so that the DP aggregation can run under the common checks, which feed one gradient."""
    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> tuple:
        del params, extra
        def batch(g: Any) -> Any:
            w = jax.numpy.array([1.0, 0.5, 2.0], g.dtype).reshape((3,) + (1,) * g.ndim)
            return w * g[None]
        return jax.tree_util.tree_map(batch, updates), state
    return lib.GradientTransformation(lambda params: lib.EmptyState(), update)


_DP_INJECT = ("inject_hyperparams(dpsgd) would be fed one gradient, not the per-example "
              "batch the case's front transformation makes")
CASES["sophia(lr=1e-2)"] = opt("sophia", extra=loss_function, learning_rate=1e-2)
CASES["sophia(update_interval=3, gamma=0.05, b1=0.9, clip_threshold=0.5)"] = opt(
    "sophia", extra=loss_function, learning_rate=1e-2, update_interval=3, gamma=0.05, b1=0.9,
    clip_threshold=0.5)
CASES["momo(lr=1e-1)"] = opt("momo", extra=value_of, learning_rate=1e-1)
CASES["momo(adapt_lower_bound, wd=1e-3, beta=0.8)"] = opt(
    "momo", extra=value_of, learning_rate=1e-1, beta=0.8, weight_decay=1e-3,
    adapt_lower_bound=True, lower_bound=-1.0)
CASES["momo_adam(lr=1e-1)"] = opt("momo_adam", extra=value_of, learning_rate=1e-1)
CASES["momo_adam(adapt_lower_bound, b2=0.99)"] = opt(
    "momo_adam", extra=value_of, learning_rate=1e-1,
    adapt_lower_bound=True, b2=0.99)
_SAM_INJECT = "sam's arguments are transformations, nothing numeric to inject"
_SAM_NAN = ("normalize divides by ||g||: once the iterate lands exactly on the parabola's "
            "minimum the gradient is 0 and 0/0 gives NaN, in optax as here")
CASES["sam(opaque, normalize, rho=1e-3)"] = Case(
    "sam", lambda lib: _sam(lib, opaque_mode=True), grad_function,
    {"inject": _SAM_INJECT, "converges": _SAM_NAN})
CASES["sam(opaque, sync_period=3, no reset, raw-gradient ascent)"] = Case(
    "sam", lambda lib: _sam(lib, normalized=False, opaque_mode=True, sync_period=3,
                            reset_state=False), grad_function, {"inject": _SAM_INJECT})
# Transparent mode: each call is one step, adversarial or outer (30000 steps end on an
# outer one for sync periods 2 and 3).
CASES["sam(transparent, raw-gradient ascent)"] = Case(
    "sam", lambda lib: _sam(lib, normalized=False), None, {"inject": _SAM_INJECT})
CASES["sam(transparent, normalize, sync_period=3)"] = Case(
    "sam", lambda lib: _sam(lib, sync_period=3, reset_state=False), None,
    {"inject": _SAM_INJECT, "converges": _SAM_NAN})
CASES["chain(sgd(1e-3), reduce_on_plateau())"] = Case(
    "reduce_on_plateau",
    lambda lib: lib.chain(lib.sgd(1e-3), lib.contrib.reduce_on_plateau()), value_of)
CASES["chain(sgd(1e-3, momentum=0.5), reduce_on_plateau(factor=0.5, patience=2, ...))"] = \
    Case("reduce_on_plateau", lambda lib: lib.chain(
        lib.sgd(1e-3, momentum=0.5), lib.contrib.reduce_on_plateau(
            factor=0.5, patience=2, cooldown=1, accumulation_size=3, min_scale=0.1)),
        value_of)
CASES["dpsgd(per-example batch, no noise)"] = Case(
    "dpsgd", lambda lib: lib.chain(_per_example(lib), lib.contrib.dpsgd(
        1e-3, l2_norm_clip=10.0, noise_multiplier=0.0, seed=0, momentum=0.9)), None,
    {"inject": _DP_INJECT})
CASES["dpsgd(per-example batch, noise, nesterov)"] = Case(
    "dpsgd", lambda lib: lib.chain(_per_example(lib), lib.contrib.dpsgd(
        1e-2, l2_norm_clip=1.0, noise_multiplier=0.5, seed=3, momentum=0.5, nesterov=True)),
    None, {"inject": _DP_INJECT,
           "converges": "noise of fixed scale (l2_norm_clip * noise_multiplier) keeps the "
                        "parameters wandering around the target"})
CASES["differentially_private_aggregate(per-example batch, key=5)"] = Case(
    "differentially_private_aggregate", lambda lib: lib.chain(
        _per_example(lib), lib.contrib.differentially_private_aggregate(0.5, 0.3, key=5),
        lib.sgd(1e-2)), None,
    {"inject": _DP_INJECT,
     "converges": "noise of fixed scale (l2_norm_clip * noise_multiplier) keeps the "
                  "parameters wandering around the target"})
# [end area: extra-args]
