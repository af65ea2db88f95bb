"""XLA:CPU only: a trust ratio's norm from a recomputed copy of its input.

Nothing here changes a number; it changes what XLA:CPU stores. Readers of the
engine can skip this module: the engine's per-leaf pass asks :func:`for_block` once
per block for a rewrite, which is :data:`NO_REWRITE` (every stage's ``update_leaf`` is
called as it is) unless :func:`applies` says so. The rewrite concerns only stages whose
``update_leaf`` is a :class:`ScaledByNormOfInput` (the trust ratio): it calls them with a
second copy of their input from :func:`input_for_norm`. No other stage, and nothing in the
stage protocol, knows about it.

The problem. A trust ratio needs the norm of its input ``u`` (e.g. LAMB's Adam
direction) before it can scale ``u``. With these two consumers XLA computes
``u`` once and stores it: a params-sized temporary per leaf, allocated every
step. On CPU, glibc serves blocks over 32 MiB with ``mmap``, so every step
page-faults through it (16M params, 2-core AMD EPYC, jax 0.10.2: lamb 50 ->
35 ms with the recompute).

The trick. The earlier stages of the fused block are re-evaluated from their
jaxpr with their scalar float constants (``eps``, the weight decay, bias
corrections, ...) passed through ``optimization_barrier``: the copy is no
longer identical to ``u``, so XLA neither merges the two nor materializes
``u``, and the norm's reduction fuses with the arithmetic that produces it.
Constants left inline would be turned into broadcast arrays by XLA:CPU's
reduction fusions; recomputing the new moments too would bring a 128 MB
temporary back, so the copy reads the moments already computed. The norm may
be summed in another order: float32 rounding (3e-7 relative in the tests).

When. Only on JAX >= :data:`MIN_JAX` (older XLA:CPU kept the temporary anyway:
measured on JAX 0.5.3 and 0.6.2), in programs lowered for the platforms in :data:`BACKENDS`
(measured to pay: CPU; picked at lowering by ``lax.platform_dependent``, so that a program
compiled for a GPU or TPU holds none of it even when traced on a CPU machine), and when the
temporaries saved reach :data:`MIN_BYTES` (below that the recomputing
reduction is the slower kernel: 2M params, 3.7 -> 4.5 ms). On GPU/TPU this was
not needed: their compilers keep no such temporary (``make accel``: lamb at its two-pass
floor on the H100 with or without it). ``tests/engine/test_recompute.py`` fails if
the recompute stops firing where it should.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from functrain import jax_compat

#: The oldest JAX on which the recompute was seen to remove the temporary (0.5.3 and 0.6.2
#: kept it; versions between these and this one were not measured).
MIN_JAX = "0.10.2"

#: Backends on which the recompute was measured to pay.
BACKENDS: tuple[str, ...] = ("cpu",)

#: The smallest total of saved temporaries (bytes) for which the recompute runs;
#: glibc's default mmap threshold is 32 MiB. Tests set it to 0 to exercise the
#: recompute on small trees.
MIN_BYTES = 32 * 2**20


def applies(saved_bytes: int) -> bool:
    """Whether to recompute in a block whose trust ratios would store ``saved_bytes``.

    Extend :data:`BACKENDS` to turn the recompute on elsewhere (or empty it to turn it off).

    Args:
      saved_bytes: the total size of the inputs the block's trust ratios would
        otherwise keep in temporaries.

    Returns:
      Whether JAX is at least :data:`MIN_JAX`, :data:`BACKENDS` names a platform and
      ``saved_bytes >= MIN_BYTES``. The platform itself is picked when the program is
      lowered (:meth:`_LeafRewrite.run`): a program lowered for another one holds no
      recompute, even when traced on a CPU machine.

    >>> applies(0)
    False
    """
    return jax_compat.jax_at_least(MIN_JAX) and bool(BACKENDS) and saved_bytes >= MIN_BYTES


def _platform_keys() -> list:
    """:data:`BACKENDS` as ``lax.platform_dependent``'s platform names."""
    return sorted({p for b in BACKENDS for p in (("cuda", "rocm") if b == "gpu" else (b,))})


class ScaledByNormOfInput:
    """An ``update_leaf`` that scales its input by a factor computed from the input's norm:
    ``(g, state, p, ctx) -> (g * factor(p, g), ())``, stateless (a trust ratio).

    Being this class is what makes the stage's input recomputable: the rewrite calls
    :meth:`with_input_for_norm` with a second, equal copy of ``g`` for ``factor``.

    Args:
      factor: ``(p, y) -> scalar``, the scale for an input equal to ``y``.

    >>> import jax.numpy as jnp
    >>> leaf = ScaledByNormOfInput(lambda p, y: 1 / jnp.linalg.norm(y))
    >>> leaf(jnp.array([3., 4.]), (), None, None)[0]
    Array([0.6, 0.8], dtype=float32)
    """

    def __init__(self, factor: Callable[[Any, jax.Array], jax.Array]) -> None:
        self.factor = factor

    def __call__(self, g: jax.Array, state: Any, p: Any, ctx: Any) -> tuple:
        return self.with_input_for_norm(g, p, g)

    def with_input_for_norm(self, g: jax.Array, p: Any, y: jax.Array) -> tuple:
        """``g`` scaled by ``factor(p, y)``, ``y`` an equal copy of ``g``."""
        return g * self.factor(p, y), ()


# A pytree of its factor, as stages are (engine.protocol): its hyperparameters are leaves.
jax.tree_util.register_pytree_node(ScaledByNormOfInput, lambda leaf: ((leaf.factor,), None),
                                   lambda _, children: ScaledByNormOfInput(*children))


def _recomputable(stage: Any) -> bool:
    return isinstance(stage.update_leaf, ScaledByNormOfInput)


class _NoRewrite:
    """The block as it is: each stage's ``update_leaf`` called as it is."""

    def for_leaf(self, x0: Any, pc: Any) -> "_NoRewrite":
        return self

    def skipped(self) -> None:
        return None

    def run(self, k: int, stage: Any, x: Any, olds: Any, p: Any, ctx: Any) -> tuple:
        return stage.update_leaf(x, olds, p, ctx)


#: What :func:`for_block` returns where the recompute does not apply.
NO_REWRITE = _NoRewrite()


class _Rewrite:
    """The recompute for one block: per leaf, what the stages before a trust ratio did."""

    def __init__(self, stages: Sequence[Any], ctxs: Sequence[Any]) -> None:
        self.stages, self.ctxs = list(stages), list(ctxs)
        self.jaxprs: dict = {}  # the prefix jaxprs, shared by same-shaped leaves

    def for_leaf(self, x0: jax.Array, pc: Any) -> "_LeafRewrite":
        return _LeafRewrite(self, x0, pc)


class _LeafRewrite:
    def __init__(self, block: _Rewrite, x0: jax.Array, pc: Any) -> None:
        self.block, self.x0, self.pc = block, x0, pc
        self.ran_: list = []  # per stage: None (masked) or (olds, new states)

    def skipped(self) -> None:
        self.ran_.append(None)

    def run(self, k: int, stage: Any, x: Any, olds: Any, p: Any, ctx: Any) -> tuple:
        """Stage ``k`` on this leaf, a recomputable one with a copy of its input."""
        b = self.block
        if _recomputable(stage) and any(r is not None for r in self.ran_):
            def recomputed(x: jax.Array) -> jax.Array:
                y = input_for_norm(b.stages[:k], b.ctxs[:k], self.ran_, self.x0, self.pc,
                                   b.jaxprs)
                return x if y is None else y

            # picked when the program is lowered: the copy on the listed platforms only
            y = jax.lax.platform_dependent(
                x, **{name: recomputed for name in _platform_keys()}, default=lambda x: x)
            out = stage.update_leaf.with_input_for_norm(x, p, y)
        else:
            out = stage.update_leaf(x, olds, p, ctx)
        self.ran_.append((olds, out[1]))
        return out


def for_block(stages: Sequence[Any], active: Sequence[Sequence[bool]], ctxs: Sequence[Any],
              gs: Sequence[jax.Array], compute_dtypes: Sequence[Any]) -> Any:
    """The rewrite of one fused block's per-leaf pass: the recompute, or none.

    Args:
      stages: the block's stages.
      active: per stage, per leaf, whether the stage runs on the leaf.
      ctxs: the stages' ``prepare`` results for this step.
      gs: the block's input leaves.
      compute_dtypes: each leaf's compute dtype.

    Returns:
      :data:`NO_REWRITE`, or the recompute when :func:`applies` to the bytes its trust
      ratios would otherwise store. Per leaf, ``for_leaf(x0, pc)`` gives an object that
      runs stage ``k`` on the leaf (``run(k, stage, x, olds, p, ctx)``, the stage's
      ``update_leaf``'s result) and is told of the stages masked out there (``skipped``).

    >>> for_block([], [], [], [], []) is NO_REWRITE
    True
    """
    saved = 0
    for k, stage in enumerate(stages):
        if not _recomputable(stage) or k == 0:
            continue
        for i, g in enumerate(gs):
            if active[k][i] and any(active[j][i] for j in range(k)):
                saved += int(np.prod(g.shape)) * jnp.dtype(compute_dtypes[i]).itemsize
    return _Rewrite(stages, ctxs) if applies(saved) else NO_REWRITE


def input_for_norm(prefix: Sequence[Any], ctxs: Sequence[Any], ran: list, x0: jax.Array,
                   pc: Any, cache: dict) -> Optional[jax.Array]:
    """The input of a :class:`ScaledByNormOfInput` stage, computed a second time for its
    norm.

    Args:
      prefix: the stages before it in the fused block.
      ctxs: their ``prepare`` results for this step.
      ran: per prefix stage, ``None`` (masked out on this leaf) or ``(old
        state, new state)`` as computed in the main pass.
      x0: the block's input leaf (compute dtype).
      pc: the parameter leaf (compute dtype) or ``None``.
      cache: a dict shared by the leaves of one trace: the opaque prefix
        jaxpr is built once per distinct signature.

    Returns:
      The recomputed input, equal to the main pass's, or ``None`` when there
      is no constant to make opaque (nothing would change).

    >>> import jax.numpy as jnp
    >>> from functrain.engine.stage import LeafStage
    >>> shift = LeafStage(name='shift', update_leaf=lambda g, s, p, c: (g + 0.5, ()))
    >>> input_for_norm([shift], [None], [((), ())], jnp.ones(2), None, {})
    Array([1.5, 1.5], dtype=float32)
    """
    olds = [None if r is None else r[0] for r in ran]

    def prefix_fn(x: jax.Array, olds: list, p: Any) -> tuple:
        news = []
        for stage, ctx, o in zip(prefix, ctxs, olds):
            if o is not None:
                x, n = stage.update_leaf(x, o, p, ctx)
                news.append(n)
        return x, news

    args = jax.tree_util.tree_leaves((x0, olds, pc))
    sig = (len(prefix), tuple(r is None for r in ran), tuple((a.shape, a.dtype) for a in args))
    if sig not in cache:
        cache[sig] = _opaque_prefix(jax.make_jaxpr(prefix_fn)(x0, olds, pc))
    if cache[sig] is None:
        return None
    jaxpr, consts, opaque = cache[sig]

    env: dict = {}
    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    known = {}  # the prefix's state outputs -> the values computed in the main pass
    news_real = jax.tree_util.tree_leaves([r[1] for r in ran if r is not None])
    known.update((v, n) for v, n in zip(jaxpr.outvars[1:], news_real) if not _is_literal(v))

    def read(v: Any) -> Any:
        if _is_literal(v):
            return opaque.get(_opaque_key(v), v.val)
        return env[v]

    for eqn in jaxpr.eqns:
        if eqn.outvars and all(v in known for v in eqn.outvars):
            env.update((v, known[v]) for v in eqn.outvars)
            continue
        params = eqn.primitive.get_bind_params(eqn.params)
        subfuns: Any = ()
        if isinstance(params, tuple):  # older JAX: (subfuns, params)
            subfuns, params = params
        outs = eqn.primitive.bind(*subfuns, *[read(v) for v in eqn.invars], **params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, o in zip(eqn.outvars, outs):
            env[v] = known.get(v, o)
    return read(jaxpr.outvars[0])


def _opaque_prefix(closed: Any) -> Optional[tuple]:
    """``(jaxpr, consts, opaque literals)`` with scalar floats behind a barrier, or None."""
    jaxpr = closed.jaxpr
    literals = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            key = _opaque_key(v)
            if key is not None:
                literals.setdefault(key, v.aval.dtype)
    scalar_consts = [i for i, v in enumerate(jaxpr.constvars)
                     if v.aval.shape == () and jnp.issubdtype(v.aval.dtype, jnp.floating)]
    if not literals and not scalar_consts:
        return None
    consts = list(closed.consts)
    hidden = jax.lax.optimization_barrier((
        tuple(np.asarray(val, dt) for (val, _), dt in literals.items()),
        tuple(consts[i] for i in scalar_consts)))
    for i, c in zip(scalar_consts, hidden[1]):
        consts[i] = c
    return jaxpr, consts, dict(zip(literals, hidden[0]))


def _is_literal(v: Any) -> bool:
    return isinstance(v, jex_core.Literal)


def _opaque_key(v: Any) -> Optional[tuple]:
    """``(value, dtype)`` of a scalar float literal (one the recompute hides), else None."""
    if (_is_literal(v) and np.shape(v.val) == ()
            and jnp.issubdtype(v.aval.dtype, jnp.floating)):
        return float(v.val), str(v.aval.dtype)
    return None
