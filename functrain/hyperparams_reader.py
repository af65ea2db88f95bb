"""Read an optimizer's hyperparameters at the current step from its state: ``current_hyperparams``.

optax users ask for the learning rate (or any scheduled value) for logging without
wrapping the optimizer in ``inject_hyperparams`` (optax issues 206 and 312, Flax 4320).
Here it is one function of the optimizer and its state::

    hparams = functrain.current_hyperparams(opt, state)   # {'learning_rate': ..., 'b1': ...}

How the optimizer knows its hyperparameters, without a change to its state or its
compiled step:

* Every builder declares its numeric arguments once, ``@hyperparameters(learning_rate=
  "schedule", b1="number", ...)`` (:mod:`functrain.arg_checks`), to check them. The same
  decorator now also records what each call was given (defaults included) against the
  transformation it returned, in a weak side table
  (:func:`~functrain.declarations.record_builder`): nothing is added to the
  ``GradientTransformation``, its state or its program, so checkpoints, optax interop and
  compiled programs are unchanged. The outermost builder's record replaces those of the
  stages it assembled (``adam``'s arguments restate ``scale_by_adam``'s).
* ``chain`` and ``named_chain`` record their members with the path of each member's
  state; a builder given transformations (``cautious(adam(...))``, a wrapper's inner
  optimizer) records them as parts whose state lies somewhere inside its own.
* A constant is reported as it was given. A schedule is evaluated at the step count
  found in the state of the part that holds it: the first integer ``count`` field there
  (the stages that consume a schedule count steps in the same ``update`` as every other
  counting stage of that part, so they all agree; Schedule-Free's ``step_count``, counted
  from 1 as optax's, where it has no ``count``; the shallowest one if several); a
  decay-rate schedule (``"decay"``,
  PaLM's ``b2``) at ``count + 1``, as the Adam family evaluates it. The count is the
  number of ``update`` calls made so far, so the values are those the **next** ``update``
  uses (read them before the update for the values it used).

The reading is a few scalar operations on the state: call it outside ``jit`` on the
state the step returned (no recompilation: the step's program is untouched), or inside a
jitted function. Where two parts declare the same name (``chain(adam(1e-3), sgd(1e-2))``),
the first keeps it and the later one is reported as ``'<builder>.<name>'`` (``'sgd.
learning_rate'``). ``masked`` reports its inner transformation's names as they are;
``multi_transform`` (``partition``) each label's under that label, ``'<label>/<name>'``
(``'a/learning_rate'``), read from that label's state. Transformations no declared builder
made (optax's own, a hand-written ``GradientTransformation``) report nothing; an optimizer
with nothing to report is an error naming it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.arg_checks import is_transformation
from functrain.declarations import builder_record

__all__ = ["current_hyperparams"]


def _step_count(state: Any, builder: str, name: str) -> jax.Array:
    """The shallowest integer scalar ``count`` (or ``step_count``) in ``state``."""
    found = [(len(path), value) for key in ("count", "step_count")
             for path, value in ft.get_all_with_path(state, key)
             if hasattr(value, "dtype") and jnp.ndim(value) == 0
             and jnp.issubdtype(value.dtype, jnp.integer)]
    if not found:
        raise ValueError(f"current_hyperparams: {builder}'s {name} is a schedule, but its "
                         f"state holds no integer step count ('count' or 'step_count') to "
                         f"evaluate it at; state: {type(state).__name__}.")
    return min(found, key=lambda pair: pair[0])[1]


def _collect(tx: Any, state: Any, out: dict, seen: set, prefix: str = "") -> None:
    record = builder_record(tx)
    if record is None or id(tx) in seen:
        return
    seen.add(id(tx))
    for name, (value, kind) in record.values.items():
        if value is None:
            continue
        if callable(value):
            count = _step_count(state, record.builder, name)
            value = value(count + 1 if kind.startswith("decay") else count)
        key, n = prefix + name, 1
        while key in out:
            key, n = prefix + f"{record.builder}.{name}" + (f"#{n}" if n > 1 else ""), n + 1
        out[key] = jnp.asarray(value)
    labels = record.labels or (None,) * len(record.parts)
    for (path, part), label in zip(record.parts, labels):
        _collect(part, state if path is None else ft.get_path(state, path), out, seen,
                 prefix if label is None else f"{prefix}{label}/")
    for part_state, part in record.read(state) if record.read is not None else ():
        _collect(part, part_state, out, seen, prefix)


def current_hyperparams(opt: Any, state: Any) -> dict[str, jax.Array]:
    """The hyperparameters of ``opt`` at the step ``state`` is at: schedules evaluated.

    Works on any optimizer built from functrain's builders (named optimizers, stages,
    contrib, their chains and wrappers), without ``inject_hyperparams`` and without
    recompiling the step (see the module's docstring for how). A schedule is evaluated at
    the state's step count, the number of updates made so far: the values are those the
    next ``update`` uses. Under ``jit`` too.

    Args:
      opt: the optimizer, as built (``functrain.adam(schedule)``, a ``chain``, ...).
      state: its state (from ``opt.init`` or ``opt.update``).

    Returns:
      A dict: argument name -> scalar array, for every numeric argument each builder
      declares (``learning_rate``, ``b1``, ``weight_decay``, ...; defaults included;
      ``None`` left out). A name declared again by a later part is keyed
      ``'<builder>.<name>'``; a name inside ``multi_transform`` is keyed
      ``'<label>/<name>'`` by the label of the transformation that declares it
      (``masked`` adds nothing to the keys).

    Raises:
      ValueError: ``opt`` was not built by functrain's builders (nothing to report), or a
        schedule's state holds no step count.

    Logging the learning rate in a training loop (with ``tqdm``, ``pbar.set_postfix``
    takes the same dict)::

        for step in (pbar := tqdm.trange(num_steps)):
            params, state, loss = train_step(params, state, batch)
            hp = functrain.current_hyperparams(opt, state)
            pbar.set_postfix(loss=float(loss), lr=float(hp['learning_rate']))

    >>> import jax.numpy as jnp, functrain
    >>> schedule = functrain.schedules.linear_schedule(1.0, 0.0, transition_steps=10)
    >>> opt = functrain.chain(functrain.clip_by_global_norm(1.0), functrain.adamw(schedule))
    >>> params = {'w': jnp.ones(3)}
    >>> state = opt.init(params)
    >>> for _ in range(4):
    ...     updates, state = opt.update(params, state, params)
    >>> hp = current_hyperparams(opt, state)
    >>> round(float(hp['learning_rate']), 6), float(hp['weight_decay']), sorted(hp)
    (0.6, 0.0001, ['b1', 'b2', 'eps', 'eps_root', 'learning_rate', 'weight_decay'])
    """
    if not is_transformation(opt):
        raise TypeError(f"current_hyperparams: opt must be an optimizer (an object with init "
                        f"and update), got {type(opt).__name__}.")
    out: dict = {}
    _collect(opt, state, out, set())
    if builder_record(opt) is None:
        raise ValueError(f"current_hyperparams: {opt!r:.80} was not built by functrain's "
                         f"builders (functrain.adam, functrain.chain, ...), so its "
                         f"hyperparameters are unknown; build it with functrain, or wrap it "
                         f"in functrain.inject_hyperparams.")
    return out
