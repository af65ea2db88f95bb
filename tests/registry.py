"""Every optimizer the tests know, declared once: ``REGISTRY`` (name -> :class:`Optimizer`).

One record per public optimizer of ``functrain`` (the named optimizers of the family modules,
``functrain/families/``) and of ``functrain.contrib`` (its public functions
that return a transformation, less the building blocks in ``NOT_OPTIMIZERS``);
``tests/test_registry.py`` fails, naming it, when one has no record. Each record
says how to build the optimizer from a module ``m`` (``functrain``, or ``optax``
where optax has it: ``record.make(optax)`` is optax's optimizer with the same
arguments), the arguments that exercise it, its reference, the settings its
parity tests run, the keyword arguments its ``update`` needs, and the checks that
do not apply to it, each with the reason.

Read by: tests/parity/test_optax_parity.py (core parity), tests/contrib/test_common.py
(contrib parity and conformance), tests/test_properties.py (hypothesis properties:
every record), tests/test_stress_list.py, tests/sharding_checks.py, tests/families/*
(the per-family checks, through helpers), tests/test_public_api.py (docs coverage).

What the package declares itself (``@declare_optimizer`` where each optimizer is defined:
whether it lives in functrain.contrib, whether optax has it) is read from
``functrain.declarations.OPTIMIZERS``, not repeated here.

Adding an optimizer: nothing here when it passes every generic check with
``learning_rate=1e-2`` (or with no arguments, if it takes no learning rate): a declared
optimizer without a record below gets :func:`default_record` (its optax reference, or for
``optax=None`` the numpy reference in ``tests/contrib/test_contrib_<name>.py``, no other
skip). Otherwise one ``_add(...)`` line below, which overrides the default: other arguments,
a ``build`` recipe, ``extra`` update keywords, a ``skip`` entry with the reason for a check
it cannot pass. A builder whose required arguments the default cannot fill (anything but
``learning_rate``) gets no default: tests/test_registry.py fails naming it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp

from functrain.declarations import OPTIMIZERS as DECLARED
from helpers import matrices_only


# The checks a record or a setting may leave out (``skip``), each with a written reason.
CHECKS = {
    # tests/contrib/test_common.py and tests/sharding_checks.py, per setting
    "parity": "same numbers as optax at every step",
    "converges": "optax's contrib targets reached in 30000 steps",
    "inject": "inject_hyperparams(factory)(**kwargs) gives the same numbers",
    "dtypes": "bfloat16 kept, unknown update keywords ignored, no recompile",
    "multisteps": "MultiSteps(opt, k) equals the large batch",
    "eval_shape": "jax.eval_shape(opt.init) from shapes alone",
    "sharding": "the state follows the params' sharding on 8 devices",
    "donation": "distinct state buffers, a donated jitted step runs",
    "scalar_leaf": "the core parity tree has a scalar leaf",
    # tests/test_properties.py, per record
    "properties": "the hypothesis properties on drawn trees (16-bit, zero-size, empty)",
    "float64": "the hypothesis properties on float64 trees",
    "mixed_16bit": "trees mixing bfloat16 and float16 leaves (properties: made bfloat16)",
    "mixed_dtypes": "trees mixing float dtypes (properties: one dtype per tree)",
    "zero_gradient": "all-zero gradients (properties: zero entries made 1)",
    "degenerate": "gradients with all-equal entries (properties: distinct offsets added)",
    "zero_size": "zero-size leaves (properties: given one entry instead)",
    "float16": "float16 leaves (properties: made bfloat16)",
    "complex_error": "a real_only optimizer refuses complex leaves with an error naming one",
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of one optimizer: the arguments, and the checks it leaves out."""

    label: str
    kwargs: Mapping[str, Any]
    skip: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """One optimizer, as every test file needs it.

    Attributes:
      name: its public name (``functrain.<name>``, or ``functrain.contrib.<name>``).
      contrib: whether it lives in ``functrain.contrib``.
      args: the arguments that exercise it (a few non-defaults; no callables, so that
        ``inject_hyperparams`` can take them): the property, conformance, stress and
        per-family checks build it with these; its first parity setting.
      reference: what its numbers are checked against: ``optax.<path>`` (the parity
        tests), or where the numpy reference written from the paper lives.
      build: ``build(m, **kwargs) -> transformation`` for a module ``m`` (functrain or
        optax); ``None``: ``m.<name>(**kwargs)`` (``m.contrib.<name>`` for contrib).
        Wrappers build their inner optimizers here.
      settings: more parity settings (other arguments), each with its own ``skip``.
      extra: ``extra(loss_fn, params) -> dict``: the keyword arguments ``update``
        needs besides the gradients (``value=`` for Polyak and momo, ``obj_fn=`` for
        sophia, ...); ``None``: none.
      real_only: why complex leaves are refused (empty: complex supported).
      decomposed: which decomposition or matrix iteration its step runs (a QR, an
        eigendecomposition, an SVD, a triangular solve, a power or Newton-Schulz iteration;
        empty: none). Two programs that round differently (jit and eager, one device and
        eight) differ in such outputs by the rounding times the decomposition's
        amplification, which no fixed float32 tolerance bounds: tests/test_properties.py
        compares its jit and eager steps on the float64 twin of each drawn tree.
        tests/test_registry.py checks that every step whose program holds a decomposition
        primitive says so here.
      skip: check (a key of ``CHECKS``) -> why it does not apply, for every setting.
    """

    name: str
    args: Mapping[str, Any]
    reference: str
    contrib: bool = False
    build: Optional[Callable[..., Any]] = None
    settings: tuple = ()
    extra: Optional[Callable[[Callable, Any], dict]] = None
    real_only: str = ""
    decomposed: str = ""
    skip: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def make(self, m: Any, **kwargs: Any) -> Any:
        """The optimizer from module ``m`` with ``kwargs`` (default: :attr:`args`)."""
        kwargs = dict(self.args) if not kwargs else kwargs
        if self.build is not None:
            return self.build(m, **kwargs)
        return getattr(m.contrib if self.contrib else m, self.name)(**kwargs)

    def factory(self, m: Any) -> Optional[Callable]:
        """``m``'s plain factory taking :attr:`args` (``None`` for a wrapper's recipe)."""
        if self.build is not None:
            return None
        return getattr(m.contrib if self.contrib else m, self.name)

    def all_settings(self) -> list:
        """The default setting (``args``, labelled by the name) and then :attr:`settings`,
        each ``skip`` merged with the record's."""
        return [Setting(s.label, s.kwargs, {**self.skip, **s.skip})
                for s in (Setting(self.name, self.args), *self.settings)]

    def update_kwargs(self, loss_fn: Callable, params: Any) -> dict:
        return self.extra(loss_fn, params) if self.extra else {}


REGISTRY: dict[str, Optimizer] = {}


def _add(name: str, args: Optional[dict] = None, *, reference: Optional[str] = None,
         settings: Optional[dict] = None, **fields: Any) -> None:
    """Records ``name`` (once). ``settings``: label -> kwargs, or label -> (kwargs, skip).
    Where it lives and its optax reference come from its ``@declare_optimizer``."""
    assert name not in REGISTRY, f"{name} recorded twice"
    assert name in DECLARED, f"{name}: no @declare_optimizer(...) on it where it is defined"
    contrib, optax_has = DECLARED[name].contrib, DECLARED[name].optax
    if reference is None:
        assert optax_has, f"{name} is declared optax=None: give its numpy reference"
        reference = f"optax.{'contrib.' if optax_has == 'contrib' else ''}{name}"
    extra = tuple(Setting(label, *s) if isinstance(s, tuple) else Setting(label, s)
                  for label, s in (settings or {}).items())
    REGISTRY[name] = Optimizer(name, dict(args or {}), reference, contrib, settings=extra,
                               **fields)


# --------------------------------------------------------------------------
# update's extra keyword arguments
# --------------------------------------------------------------------------

def value_of(loss_fn: Callable, params: Any) -> dict:
    """``{'value': loss_fn(params)}``: Polyak, momo, reduce_on_plateau."""
    return {"value": loss_fn(params)}


def loss_function(loss_fn: Callable, params: Any) -> dict:
    """``{'obj_fn': loss_fn}``: sophia's Hessian estimate differentiates the objective."""
    del params
    return {"obj_fn": loss_fn}


def grad_function(loss_fn: Callable, params: Any) -> dict:
    """``{'grad_fn': (params, step) -> grads}``: sam's opaque mode."""
    del params
    return {"grad_fn": lambda p, _: jax.grad(loss_fn)(p)}


def warmup(start: float, end: float, steps: int = 100) -> Callable:
    """A linear warm-up schedule (AdEMAMix's b3/alpha), the same for both libraries."""
    return lambda count: start + (end - start) * jnp.minimum(count / steps, 1.0)


# --------------------------------------------------------------------------
# optax's core optimizers, from the family modules (parity: tests/parity/)
# --------------------------------------------------------------------------

M = matrices_only
_add("sgd", dict(learning_rate=1e-3, momentum=0.9), settings={
    "sgd_plain": dict(learning_rate=1e-3),
    "sgd_nesterov": dict(learning_rate=1e-3, momentum=0.5, nesterov=True)})
_add("adam", dict(learning_rate=1e-2), settings={
    "adam_settings": dict(learning_rate=3e-3, b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-8),
    "adam_nesterov": dict(learning_rate=1e-2, nesterov=True)})
_add("adamw", dict(learning_rate=1e-2), settings={
    "adamw_masked": dict(learning_rate=1e-2, weight_decay=0.1, mask=M),
    "adamw_nesterov": dict(learning_rate=1e-2, b1=0.7, weight_decay=0.05, nesterov=True)})
_add("lamb", dict(learning_rate=1e-2), settings={
    "lamb_decay": dict(learning_rate=1e-2, b1=0.8, eps=1e-8, weight_decay=0.01),
    "lamb_masked": dict(learning_rate=1e-2, weight_decay=0.1, mask=M)})
_add("lars", dict(learning_rate=0.1), settings={
    "lars_settings": dict(learning_rate=0.5, weight_decay=1e-3, trust_coefficient=0.01,
                          eps=1e-6, momentum=0.8, nesterov=True),
    "lars_masks": dict(learning_rate=0.5, weight_decay=1e-2, weight_decay_mask=M,
                       trust_ratio_mask=M)})
_add("rmsprop", dict(learning_rate=1e-3, decay=0.8, centered=True, momentum=0.9,
                     initial_scale=0.5), settings={
    "rmsprop_plain": dict(learning_rate=1e-3),
    "rmsprop_bias": dict(learning_rate=1e-3, eps_in_sqrt=False, bias_correction=True,
                         momentum=0.5, nesterov=True)})
_add("adagrad", dict(learning_rate=1e-2), settings={
    "adagrad_settings": dict(learning_rate=0.1, initial_accumulator_value=0.5, eps=1e-5)})
_add("lion", dict(learning_rate=1e-3), settings={
    "lion_settings": dict(learning_rate=1e-4, b1=0.8, b2=0.9, weight_decay=0.1, mask=M)})
# adan, optimistic_adam (deprecated in both: warns) and optimistic_adam_v2: default records.
# No momentum in args: its momentum is float32 by default (as optax), no complex version.
_add("adafactor", dict(learning_rate=1e-2, min_dim_size_to_factor=2),
     settings={"adafactor_defaults": {},
               "adafactor_factored": dict(learning_rate=1e-2, min_dim_size_to_factor=2,
                                          momentum=0.9, weight_decay_rate=1e-3, decay_offset=3,
                                          clipping_threshold=None),
               "adafactor_unfactored": dict(
                   learning_rate=lambda c: 1e-2 / (1.0 + c), factored=False,
                   multiply_by_parameter_scale=False, decay_rate=0.5, eps=1e-20,
                   weight_decay_rate=1e-2, weight_decay_mask=M)})
_add("nadam", dict(learning_rate=1e-2, b2=0.99, eps_root=1e-8))
_add("nadamw", dict(learning_rate=1e-2, b1=0.8, weight_decay=0.1), settings={
    "nadamw_masked": dict(learning_rate=1e-2, b1=0.8, weight_decay=0.1, mask=M)})
_add("adabelief", dict(learning_rate=1e-2, b1=0.8, eps=1e-10), settings={
    "adabelief_nesterov": dict(learning_rate=1e-2, nesterov=True)})
_add("adamax", dict(learning_rate=1e-2, b1=0.8, eps=1e-6))
_add("adamaxw", dict(learning_rate=1e-2, b2=0.99, weight_decay=1e-2), settings={
    "adamaxw_schedule_masked": dict(learning_rate=1e-2, b2=0.99,
                                    weight_decay=lambda c: 1e-2 * c, mask=M)})
_add("novograd", dict(learning_rate=1e-2, b1=0.8, b2=0.5, eps=1e-4, eps_root=1e-8,
                      weight_decay=0.01))
_add("radam", dict(learning_rate=1e-2), settings={
    "radam_nesterov": dict(learning_rate=1e-2, b2=0.99, threshold=4.0, eps_root=1e-8,
                           nesterov=True)})
_add("sm3", dict(learning_rate=0.1, momentum=0.5),
     real_only="its accumulators are maxima of squares over axes: no complex version",
     skip={"scalar_leaf": "optax's sm3 fails on scalar leaves (the parity tree has none)"})
_add("sign_sgd", dict(learning_rate=1e-3))
_add("signum", dict(learning_rate=1e-3, beta=0.8))
_add("amsgrad", dict(learning_rate=1e-2, b1=0.8, eps_root=1e-8, bias_correction_nu=False))
_add("yogi", dict(learning_rate=1e-2, b1=0.8, b2=0.99, eps=1e-4))
_add("fromage", dict(learning_rate=1e-2), settings={
    "fromage_schedule": dict(learning_rate=lambda c: 1e-2 / (1.0 + c))})
_add("noisy_sgd", dict(learning_rate=1e-3, eta=0.1, gamma=0.3, key=3))
_add("adadelta", dict(learning_rate=1.0), settings={
    "adadelta_decay": dict(learning_rate=1.0, rho=0.8, eps=1e-4, weight_decay=0.01,
                           weight_decay_mask=M)})
_add("rprop", dict(learning_rate=1e-2, eta_minus=0.3, eta_plus=1.5, min_step_size=1e-4,
                   max_step_size=0.05),
     real_only="it steps by the sign of g * g_prev: no complex version")
_add("polyak_sgd", dict(max_learning_rate=1.0), extra=value_of, settings={
    "polyak_sgd_plus": dict(max_learning_rate=0.1, scaling=0.5, f_min=-1.0, eps=1e-3,
                            variant="sps+")})
_add("optimistic_gradient_descent", dict(learning_rate=1e-2, alpha=0.5, beta=2.0))
# A fixed step: a line search needs value_fn (tests/families/test_quasi_newton_optimizers.py).
_add("lbfgs", dict(learning_rate=1e-3, memory_size=4, linesearch=None))
del M


# --------------------------------------------------------------------------
# functrain.contrib, as optax.contrib (parity and conformance: tests/contrib/test_common.py)
# --------------------------------------------------------------------------

def _contrib(name: str, args: Optional[dict] = None, **fields: Any) -> None:
    assert DECLARED[name].contrib, f"{name} is not declared as one of functrain.contrib's"
    _add(name, args, **fields)


# Whole-tree scalars kept in the tree's lowest float dtype (as optax.tree.dtype(..., 'lowest')).
_LOWEST = {"mixed_16bit": "a tree-wide scalar is kept in the tree's lowest float dtype "
                          "(tree.dtype(..., 'lowest'), as optax), which raises when bfloat16 and "
                          "float16 leaves meet (neither promotes to the other); optax.contrib's "
                          "raises the same way"}


# The 2-D leaves go to Muon, the others to AdamW.
_NEWTON_SCHULZ = "Newton-Schulz iterations orthogonalize each matrix's momentum"
_contrib("muon", dict(learning_rate=1e-2), decomposed=_NEWTON_SCHULZ, settings={
    "muon(nesterov=False)": dict(learning_rate=1e-2, nesterov=False),
    "muon(adaptive=True)": dict(learning_rate=1e-2, adaptive=True),
    "muon(aol, consistent_rms=0.2, weight_decay)": dict(
        learning_rate=1e-2, preconditioning="aol", consistent_rms=0.2, weight_decay=1e-3,
        adam_learning_rate=3e-2),
    "muon(dion coefficients, ns_steps=6)": dict(learning_rate=1e-2, ns_coeffs="dion",
                                                ns_steps=6)})
# optax's own contrib settings (its _common_test.py).
# warmup_steps=2, where optax's test has 5000: the warmup's float32 value (init - end) *
# (1 - t/T) + end cancels catastrophically when t/T is small (4.6e-4 relative at t/T = 2e-4,
# in optax as here), so jit and eager programs differed by 1e-4 depending on how XLA fused
# it. At T = 2 every value is exact (0, 0.005, 0.01), so any two programs agree.
_contrib("schedule_free_sgd", dict(learning_rate=1e-2, warmup_steps=2), skip=_LOWEST)
_contrib("schedule_free_adamw", dict(learning_rate=1e-2, warmup_steps=2), skip=_LOWEST)
_WRAPS = "its arguments are transformations: nothing numeric to inject (own test file)"
_contrib("schedule_free", dict(learning_rate=1e-2), skip={"inject": _WRAPS, **_LOWEST},
         build=lambda m, **kw: m.contrib.schedule_free(m.sgd(1e-2), **kw))
_DISTANCE = "its step-size estimate is a real inner product of gradients and distances"
_ZERO_D = {"zero_gradient": "its distance estimate divides 0 by 0 when every gradient and "
                            "the params are 0: NaN, in optax.contrib as here",
           "float16": "its distance estimate starts at d0 = 1e-6, below float16's smallest "
                      "normal (6.1e-5), and is kept in the params' dtype: in float16 the "
                      "estimate's sums underflow to 0 / 0, NaN at every step (measured on "
                      "random trees), in optax.contrib as here"}
_contrib("prodigy", dict(learning_rate=1e-1), real_only=_DISTANCE, skip={**_LOWEST, **_ZERO_D})
_contrib("dadapt_adamw", dict(learning_rate=1e-1), real_only=_DISTANCE,
         skip={**_LOWEST, **_ZERO_D})
_contrib("dog", dict(learning_rate=1.0), skip=_LOWEST)
_contrib("dowg", dict(learning_rate=1.0), skip=_LOWEST)
_contrib("cocob", {}, real_only="coin betting's wealth and bets are real quantities",
         settings={"cocob(weight_decay=1e-2)": dict(weight_decay=1e-2)})
_contrib("mechanize", dict(base="sgd", learning_rate=1e-1, weight_decay=0.0),
         skip={"inject": _WRAPS, **_LOWEST},
         real_only="its scale is learned from a real inner product of updates and gradients",
         build=lambda m, base, learning_rate, **kw: m.contrib.mechanize(
             getattr(m, base)(learning_rate), **kw),
         settings={"mechanize(adam(1.0), weight_decay=0)": dict(
             base="adam", learning_rate=1.0, weight_decay=0.0)})
_contrib("adopt", dict(learning_rate=1e-2), real_only="it clips g / sqrt(nu) by value",
         settings={
    "adopt(nesterov, b2=0.999)": dict(learning_rate=1e-2, nesterov=True, b2=0.999),
    "adopt(clip_value_fn=1)": dict(learning_rate=1e-2, clip_value_fn=lambda count: 1.0)})
_contrib("ademamix", dict(learning_rate=1e-3), settings={
    "ademamix(b3, alpha schedules)": dict(learning_rate=1e-3, b3=warmup(0.9, 0.999),
                                          alpha=warmup(0.0, 5.0), b1=0.75)})
_contrib("simplified_ademamix", dict(learning_rate=1e-3), settings={
    "simplified_ademamix(alpha schedule)": dict(learning_rate=1e-3, alpha=warmup(0.0, 2.0),
                                                b1=0.9)})
_contrib("madgrad", dict(learning_rate=1e-2),
         real_only="its dual averaging takes the cube root of a sum of squared gradients",
         settings={
    "madgrad(momentum=0.5, lr=3e-2)": dict(learning_rate=3e-2, momentum=0.5)})
# The default eps=1e-16 divides by |g_(t-1)|: see its setting's skip.
_contrib("acprop", dict(learning_rate=1e-3, b1=0.5, eps=1e-3), settings={
    "acprop(lr=1e-3)": (dict(learning_rate=1e-3), {
        "sharding": "ACProp divides g_t by |g_(t-1)| (eps=1e-16): on the 4x2 mesh the sharded "
                    "gradient's reduction order changes its last bits, and that ratio amplifies "
                    "them to 3.6e-5 relative on one entry after 3 steps (optax.contrib.acprop "
                    "differs the same way there); the eps=1e-3 setting checks the state's "
                    "sharding"})})
_contrib("galore", dict(learning_rate=1e-2, rank=8), real_only="its SVD projection is real",
         decomposed="an SVD of each matrix's gradient gives its projection",
         settings={
    "galore(rank=1, update_proj_gap=7, scale=0.5)": dict(
        learning_rate=1e-2, rank=1, update_proj_gap=7, scale=0.5)})
_NORMALIZE = ("g / ||g|| is 0/0 for an all-zero gradient: NaN, in optax.contrib.normalize "
              "as here")
_contrib("normalize", {}, skip={"zero_gradient": _NORMALIZE,
    "converges": "normalize is a building block with no step size: g / ||g|| is an ascent "
                 "direction of length 1, it does not descend to any target"})
_contrib("split_real_and_imaginary", dict(learning_rate=1e-2), skip={"inject": _WRAPS},
         build=lambda m, **kw: m.contrib.split_real_and_imaginary(m.adam(**kw)))


# Optimizers whose update takes more than the gradients, and wrappers of a whole step.
def _sam(m: Any, rho: float = 1e-3, normalized: bool = True, **kwargs: Any) -> Any:
    """SAM as optax's docs build it: an outer adam, and as the adversarial optimizer sgd of
    step rho on the normalized gradient (or on the raw gradient, ``normalized=False``)."""
    adv = m.chain(m.contrib.normalize(), m.sgd(rho)) if normalized else m.sgd(rho)
    return m.contrib.sam(m.adam(1e-2), adv, **kwargs)


def _per_example(m: Any) -> Any:
    """Turns a gradient into a batch of 3 per-example gradients (g, 0.5 g, 2 g) on axis 0,
    so that the DP aggregation runs where the checks feed one gradient."""
    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> tuple:
        del params, extra

        def batch(g: Any) -> Any:
            w = jnp.array([1.0, 0.5, 2.0], g.dtype).reshape((3,) + (1,) * g.ndim)
            return w * g[None]
        return jax.tree_util.tree_map(batch, updates), state
    return m.GradientTransformation(lambda params: m.EmptyState(), update)


_contrib("sophia", dict(learning_rate=1e-2), extra=loss_function, skip={
    "mixed_dtypes": "Hutchinson's random vectors take one dtype for the whole tree: a tree "
                    "mixing float dtypes fails in jax.jvp, in optax.contrib.sophia as here"},
         real_only="its Hessian estimate (Hutchinson's, Rademacher vectors) is real",
         settings={
    "sophia(update_interval=3, gamma=0.05, b1=0.9, clip_threshold=0.5)": dict(
        learning_rate=1e-2, update_interval=3, gamma=0.05, b1=0.9, clip_threshold=0.5)})
_MOMO = "its step compares a real model of the loss (<g, x> terms) with a lower bound"
_contrib("momo", dict(learning_rate=1e-1), extra=value_of, skip=_LOWEST, real_only=_MOMO,
         settings={
    "momo(adapt_lower_bound, wd=1e-3, beta=0.8)": dict(
        learning_rate=1e-1, beta=0.8, weight_decay=1e-3, adapt_lower_bound=True,
        lower_bound=-1.0)})
_contrib("momo_adam", dict(learning_rate=1e-1), extra=value_of, skip=_LOWEST,
         real_only=_MOMO, settings={
    "momo_adam(adapt_lower_bound, b2=0.99)": dict(learning_rate=1e-1, adapt_lower_bound=True,
                                                  b2=0.99)})
_SAM_NAN = ("normalize divides by ||g||: once the iterate lands exactly on the parabola's "
            "minimum the gradient is 0 and 0/0 gives NaN, in optax as here")
# Opaque mode calls grad_fn itself; transparent mode ignores it (each call is one step,
# adversarial or outer: 30000 steps end on an outer one for sync periods 2 and 3).
_contrib("sam", dict(normalized=False, opaque_mode=True, sync_period=3, reset_state=False),
         extra=grad_function, build=_sam,
         skip={"inject": "sam's arguments are transformations, nothing numeric to inject"},
         settings={
             "sam(opaque, normalize, rho=1e-3)": (dict(opaque_mode=True),
                                                  {"converges": _SAM_NAN}),
             "sam(transparent, raw-gradient ascent)": dict(normalized=False),
             "sam(transparent, normalize, sync_period=3)": (
                 dict(sync_period=3, reset_state=False), {"converges": _SAM_NAN})})
_contrib("reduce_on_plateau", {}, extra=value_of, skip={"inject": _WRAPS, **_LOWEST},
         build=lambda m, momentum=None, **kw: m.chain(
             m.sgd(1e-3, momentum=momentum), m.contrib.reduce_on_plateau(**kw)),
         settings={"chain(sgd(1e-3, momentum=0.5), reduce_on_plateau(factor=0.5, ...))": dict(
             momentum=0.5, factor=0.5, patience=2, cooldown=1, accumulation_size=3,
             min_scale=0.1)})
_DP_INJECT = ("inject_hyperparams(dpsgd) would be fed one gradient, not the per-example "
              "batch the setting's front transformation makes")
_NOISE = ("noise of fixed scale (l2_norm_clip * noise_multiplier) keeps the parameters "
          "wandering around the target")
_contrib("dpsgd", dict(learning_rate=1e-3, l2_norm_clip=10.0, noise_multiplier=0.0, seed=0,
                       momentum=0.9),
         build=lambda m, **kw: m.chain(_per_example(m), m.contrib.dpsgd(**kw)),
         skip={"inject": _DP_INJECT}, settings={
             "dpsgd(noise, nesterov)": (dict(learning_rate=1e-2, l2_norm_clip=1.0,
                                             noise_multiplier=0.5, seed=3, momentum=0.5,
                                             nesterov=True), {"converges": _NOISE})})
_contrib("differentially_private_aggregate", dict(l2_norm_clip=0.5, noise_multiplier=0.3, key=5),
         build=lambda m, **kw: m.chain(
             _per_example(m), m.contrib.differentially_private_aggregate(**kw), m.sgd(1e-2)),
         skip={"inject": _DP_INJECT, "converges": _NOISE})


# --------------------------------------------------------------------------
# functrain.contrib beyond optax: no optax reference; each is checked against a numpy
# version of the paper's pseudo-code in its own test file
# --------------------------------------------------------------------------

def _beyond(name: str, args: dict, tests: str = "", own: Optional[dict] = None,
            **fields: Any) -> None:
    """An optimizer optax lacks. ``own``: check -> the test of ``tests`` that does it
    already (the common check would repeat it)."""
    assert DECLARED[name].optax is None, f"{name} is declared optax={DECLARED[name].optax!r}"
    tests = tests or f"tests/contrib/test_contrib_{name}.py"
    reason = f"optax has no {name}: numpy reference in {tests}"
    skip = {"parity": reason, "inject": reason, **fields.pop("skip", {})}
    skip.update((check, f"already checked in {tests}: {test}") for check, test in
                (own or {}).items())
    _contrib(name, args, reference=reason, skip=skip, **fields)


_OWN_SHARDING = ("its own 8-device check in tests/sharding_checks.py (check_soap); here its "
                 "(16, 16) eigenbasis of 'proj' is taken for proj's own state by shape, a "
                 "false match")
_OWN_CHECK = "its own 8-device check: {} (the generic one would repeat it, at 8-device cost)"
_EIGH = "its preconditioners are real symmetric matrices (G G^T, their roots or eigenbases)"
_beyond("shampoo", dict(learning_rate=1e-2), decomposed="eigh of each statistic for its "
        "inverse root", own={
    "dtypes": "test_bfloat16_params_keep_bfloat16_updates",
    "multisteps": "test_multisteps_equals_the_mean_gradient"}, skip={
    "sharding": _OWN_CHECK.format("tests/matrix_sharding_checks.py, check_shampoo_*")})
_beyond("soap", dict(learning_rate=1e-2), real_only=_EIGH,
        decomposed="eigh, then QR power steps, of each statistic for its eigenbasis", own={
    "dtypes": "test_bfloat16_params_keep_bfloat16_updates",
    "multisteps": "test_multisteps_averages_gradients"}, skip={"sharding": _OWN_SHARDING,
    "degenerate": "a rank-1 gradient (all entries equal) has a repeated eigenvalue: its "
                  "eigenbasis is not unique, Adam's per-coordinate statistics in it depend on "
                  "which one eigh returns, and jit and eager (different roundings) pick "
                  "different ones"})
# splus: a sign method whose vectors step by lr * nonstandard_constant (0.001) against a 1e-2
# weight decay: with its defaults optax's targets (vectors) cannot be reached in 30000 steps.
# With the constant 1 and no decay they are (measured: 0.041 from Rosenbrock's minimum at
# lr=1e-3; at lr=1e-2 sign steps zig-zag across the valley and end 0.13 away).
_beyond("splus", dict(learning_rate=1e-3, weight_decay=0.0, nonstandard_constant=1.0),
        real_only=_EIGH, decomposed="eigh of each statistic for its eigenbasis", skip={
    "sharding": _OWN_CHECK.format("tests/matrix_sharding_checks.py, check_splus_*") + "; and "
                "on this check's model the first statistics of w1 (16, 32) and w2 (32, 8) are "
                "rank-deficient: eigh's basis of their null space is arbitrary, rounding (4x2 "
                "vs 1 device) picks it, and the signs taken in it differ (measured: 485 of "
                "w1's 512 entries)"})
_beyond("kron", dict(learning_rate=1e-2),
        decomposed="triangular solves against its Kronecker factors", own={
    "dtypes": "test_bfloat16_params_keep_bfloat16_updates",
    "multisteps": "test_multisteps_equals_kron_on_mean_gradients"}, skip={
    "sharding": "FINDING, reported: on the 4x2 mesh (plain jit) the momentum of the (8,) "
                "leaf 'b2' (params replicated, P()) comes out split as P('model')",
    "converges": "with a constant step Kron ends 30000 steps circling Rosenbrock's minimum, "
                 "outside optax's 3e-2 bar: (0.968, 0.932) at lr=1e-2, (0.916, 0.942) at "
                 "3e-2 (measured); test_contrib_kron.py checks it trains an ill-conditioned "
                 "least-squares problem better than Adam"})
_beyond("mars", dict(learning_rate=1e-2), skip={
    "sharding": _OWN_CHECK.format("tests/sharding_checks.py, check_mars_came")})
_MODIFIERS = "tests/contrib/test_contrib_modifiers.py"
_beyond("cautious", dict(learning_rate=1e-2), tests=_MODIFIERS,
        build=lambda m, **kw: m.contrib.cautious(m.adam(**kw)))
_beyond("cautious_adamw", dict(learning_rate=1e-2), tests=_MODIFIERS)
_beyond("cautious_lion", dict(learning_rate=1e-3), tests=_MODIFIERS)
_beyond("mars_correction", dict(gamma=0.05, b1=0.9), tests=_MODIFIERS,
        build=lambda m, **kw: m.chain(m.contrib.mars_correction(**kw), m.lion(1e-3)))
_beyond("trust_region_clip", dict(lerp=0.9, scale=1.5), tests=_MODIFIERS,
        real_only="tanh, sign and a clip to [-2, 2]: no complex version (as clip)",
        build=lambda m, **kw: m.chain(m.adam(1e-2), m.contrib.trust_region_clip(**kw)))
_beyond("came", dict(learning_rate=1e-2), skip={
    "sharding": _OWN_CHECK.format("tests/sharding_checks.py, check_mars_came")})
_beyond("dion", dict(learning_rate=1e-2),
        decomposed="a power iteration with a QR of each matrix's momentum", skip={
    "sharding": "its own 8-device checks in tests/multiprocess/dion_worker.py (run by "
                "tests/contrib/test_contrib_dion_devices.py); here the right factor Q (16, 16) "
                "of 'proj' is taken for proj's own state by its shape, a false match (without "
                "the Q leaves the generic check passes: measured)",
    "degenerate": "a gradient with all-equal entries has rank 1: at rank r > 1 the other "
                  "r - 1 columns of orth(B Q) are spanned by rounding noise and the matching "
                  "columns of R (noise over its norm plus eps) are not small, so jit and eager "
                  "(different roundings) give different updates; the authors' code is as "
                  "ill-posed there (its Cholesky QR of a rank-deficient B Q fails)"})
# apollo at rank 4: its default rank (256) is above every dimension of the checks' small
# trees, where it is capped to the matrix's smaller side and the projected moments take the
# params' shapes (a square projection): rank 4 checks the projected method itself.
_beyond("apollo", dict(learning_rate=1e-2, rank=4))
# Two micro-batches per optimizer step: every check sees its accumulation (zero updates on
# odd calls). MultiSteps(opt, k) fed k gradients calls opt once, which returns zeros as
# opt on the mean gradient does: the generic check would compare zeros with zeros.
_beyond("adam_accumulation", dict(learning_rate=1e-2, num_micro_batches=2), own={
    "multisteps": "test_first_moment_is_multisteps_adamw_and_second_larger_by_the_variance"})
# apollo_mini: apollo's test file checks it (adam_mini, apollo, laprop: their default records).
_beyond("apollo_mini", dict(learning_rate=1e-2), tests="tests/contrib/test_contrib_apollo.py")
# The Muon family's other members: their default records, with Newton-Schulz marked.
_beyond("normuon", dict(learning_rate=1e-2), decomposed=_NEWTON_SCHULZ)
_beyond("adamuon", dict(learning_rate=1e-2), decomposed=_NEWTON_SCHULZ)
# SOAP-Muon: SOAP's eigenbases (eigh, then QR power steps) of each matrix's Gram statistics,
# then Newton-Schulz.
_beyond("soap_muon", dict(learning_rate=1e-2), real_only=_EIGH,
        decomposed="eigh, then QR power steps, of each matrix's Gram statistics for its "
                   "eigenbasis; Newton-Schulz iterations orthogonalize the whitened momentum",
        skip={"sharding": "on this check's model the (16, 16) Gram statistic and eigenbasis "
                          "of 'proj' (16, 16) are taken for proj's own state by their shape, "
                          "a false match (as soap's, whose own 8-device check, check_soap, "
                          "covers the eigenbasis code soap_muon shares)"})
# The hyperball pair (one test file): MuonH with Newton-Schulz marked.
_HYPERBALL = "tests/contrib/test_contrib_hyperball.py"
_ON_THE_SPHERE = {"converges": "a hyperball matrix keeps its initial norm, and optax's targets "
                                "lie at other norms; test_contrib_hyperball.py checks the norm "
                                "kept and each step's size instead"}
_beyond("muonh", dict(learning_rate=1e-2), tests=_HYPERBALL, decomposed=_NEWTON_SCHULZ,
        skip=_ON_THE_SPHERE)
_beyond("adamh", dict(learning_rate=1e-2), tests=_HYPERBALL, skip=_ON_THE_SPHERE)
# Scion (the official 'Auto' norms), with Newton-Schulz marked: the record runs the
# unconstrained variant, which reaches optax's targets at lr=1e-3 (measured: within 3e-3 of
# each); the constrained default, its setting, cannot.
_beyond("scion", dict(learning_rate=1e-3, constrained=False), decomposed=_NEWTON_SCHULZ,
        settings={"scion(constrained)": (dict(learning_rate=1e-2), {
            "converges": "the constrained method keeps each leaf in its ball of radius scale "
                         "(1 here) and optax's targets lie outside (e.g. the matrix parabola's "
                         "[[3, -2], [1, 4]]); test_contrib_scion.py checks the ball is kept"})})
# MuonClip: the registry's drawn trees have no attention layers, so its record names none
# (qk_layers={}, update(..., attention_logits={})): the clip is a no-op there and the generic
# checks run muon_clip's Muon step and the clip stage's tree and keyword handling; the clip
# itself (fused, per-head and stacked layouts, muon_clip's steps, the attention model demo) is
# checked in tests/contrib/test_contrib_muon_clip.py.
_beyond("muon_clip", dict(learning_rate=1e-2, qk_layers={}), decomposed=_NEWTON_SCHULZ,
        extra=lambda loss_fn, params: {"attention_logits": {}})
# tail_ema around adam: its updates are adam's (the average is read out separately).
_beyond("tail_ema", dict(tau=3.0, start_step=2), build=lambda m, **kw: m.contrib.tail_ema(
    m.adam(1e-2), **kw))
# ema_nesterov around adam: the params it produces are the look-ahead points.
_beyond("ema_nesterov", dict(lookahead_stepsize=0.3, lookahead_ema=0.9),
        build=lambda m, **kw: m.contrib.ema_nesterov(m.adam(1e-2), **kw))


# --------------------------------------------------------------------------
# Every other declared optimizer: its default record
# --------------------------------------------------------------------------

def default_record(name: str) -> Optimizer:
    """The record of a declared optimizer with no ``_add`` line: ``learning_rate=1e-2`` if
    its builder takes a learning rate (else no arguments), its optax reference from the
    declaration, or for ``optax=None`` the numpy reference of ``_beyond``'s default test
    file (parity and inject skipped, as ``_beyond``), no other skip.

    Raises:
      ValueError: naming it, when the builder has a required argument other than
        ``learning_rate`` (a transformation to wrap, a clipping norm...): it needs a record.
    """
    params = inspect.signature(DECLARED[name].function).parameters
    required = [p for p, v in params.items() if v.default is inspect.Parameter.empty
                and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD) and p != "learning_rate"]
    if required:
        raise ValueError(f"{name}: the default record cannot fill its required argument(s) "
                         f"{required}: add a record for it to tests/registry.py")
    args = dict(learning_rate=1e-2) if "learning_rate" in params else {}
    saved = dict(REGISTRY)  # recorded by the same code as an _add line, then REGISTRY restored
    REGISTRY.clear()
    try:
        (_beyond if DECLARED[name].optax is None else _add)(name, args)
        return REGISTRY[name]
    finally:
        REGISTRY.clear()
        REGISTRY.update(saved)


# declared name -> why it has no record (tests/test_registry.py names each).
NO_RECORD: dict[str, str] = {}
for _name in DECLARED:
    if _name not in REGISTRY:
        try:
            REGISTRY[_name] = default_record(_name)
        except ValueError as error:
            NO_RECORD[_name] = str(error)
del _name


# --------------------------------------------------------------------------
# What must have a record: found in the package, so a new optimizer cannot be forgotten
# --------------------------------------------------------------------------

# Public functions of functrain.contrib that return a transformation but are parts of
# the optimizers above, not optimizers (besides every scale_by_*, the same for all).
NOT_OPTIMIZERS = {
    "hutchinson_estimator_diag_hessian": "sophia's Hessian estimate (tests/contrib/"
                                         "test_contrib_sophia.py)",
    "qk_clip": "muon_clip's clip stage, the last of any chain (tests/contrib/"
               "test_contrib_muon_clip.py)",
}


def is_named_optimizer(name: str, obj: Any) -> bool:
    """Whether a public name is a named optimizer: a function whose return annotation is a
    transformation, less ``scale_by_*`` (building blocks) and ``NOT_OPTIMIZERS``."""
    return (inspect.isfunction(obj) and not name.startswith(("_", "scale_by_"))
            and name not in NOT_OPTIMIZERS
            and "GradientTransformation" in str(inspect.signature(obj).return_annotation))


def optimizer_functions(module: Any = None) -> dict:
    """name -> function for the public functions defined in ``module`` (a family's module of
    named optimizers); by default optax's core optimizers, found in the package: every named
    optimizer (:func:`is_named_optimizer`) of a module of ``functrain/families/`` that
    ``functrain`` exports and ``functrain.contrib`` does not."""
    if module is not None:
        return {name: obj for name, obj in vars(module).items()
                if inspect.isfunction(obj) and obj.__module__ == module.__name__
                and not name.startswith("_")}
    import functrain.contrib
    import functrain.families
    found = {}
    for info in pkgutil.walk_packages(functrain.families.__path__, "functrain.families."):
        for name, obj in optimizer_functions(importlib.import_module(info.name)).items():
            if (getattr(functrain, name, None) is obj and is_named_optimizer(name, obj)
                    and getattr(functrain.contrib, name, None) is not obj):
                found[name] = obj
    return found


def optimizer_names(module: Any) -> list:
    """The optimizers a family's test file parametrizes over: those ``module`` defines."""
    return sorted(optimizer_functions(module))


def contrib_functions(face: Any = None) -> dict:
    """name -> function for the optimizers of ``functrain.contrib`` (or of ``face``, a
    stand-in for it): its named optimizers (:func:`is_named_optimizer`)."""
    if face is None:
        import functrain.contrib as face
    return {name: obj for name, obj in vars(face).items() if is_named_optimizer(name, obj)}


def names(*, contrib: Optional[bool] = None, without: str = "") -> list:
    """The sorted record names (only core or only contrib ones if ``contrib`` is given),
    less those that skip the check ``without``."""
    return sorted(n for n, r in REGISTRY.items()
                  if (contrib is None or r.contrib == contrib) and without not in r.skip)


def settings(*, contrib: Optional[bool] = None, without: str = "") -> dict:
    """label -> (record, setting) for every setting of every record, less the settings
    that skip ``without``."""
    found = {}
    for r in REGISTRY.values():
        if contrib is None or r.contrib == contrib:
            for s in r.all_settings():
                if without not in s.skip:
                    assert s.label not in found, f"two settings labelled {s.label}"
                    found[s.label] = (r, s)
    return found
