"""Reuse a line search's last evaluation: ``value_and_grad_from_state``.

A line search (:mod:`functrain.families.quasi_newton.linesearch`) evaluates the
objective and its gradient at the point it accepts and keeps both in its state
(``value``, ``grad``). :func:`value_and_grad_from_state` returns them as the next
step's value and gradient instead of computing them again.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.engine.protocol import OptState, Params

Array = jax.Array


def _find_fields(tree: Any, name: str, path: str = "state") -> list:
    """``(path, value)`` of every NamedTuple field or dict entry called ``name`` in ``tree``."""
    found = []
    if ft.is_named_tuple(tree):
        items = [(f, getattr(tree, f), f".{f}") for f in tree._fields]
    elif isinstance(tree, dict):
        items = [(k, v, f"[{k!r}]") for k, v in tree.items()]
    elif isinstance(tree, (list, tuple)):
        items = [(None, v, f"[{i}]") for i, v in enumerate(tree)]
    else:
        return found
    for key, child, step in items:
        if key == name:
            found.append((path + step, child))
        else:
            found.extend(_find_fields(child, name, path + step))
    return found


class _SeveralFound(KeyError, ValueError):  # optax raises KeyError there; a ValueError too
    __str__ = BaseException.__str__  # the message, not KeyError's repr of it


def value_and_grad_from_state(value_fn: Callable[..., Array]) -> Callable[..., tuple]:
    """``jax.value_and_grad(value_fn)``, but reusing the value and gradient in the state.

    A line search evaluates the objective and its gradient at the point it
    accepts and stores them (``value``, ``grad`` in its state). For a
    deterministic objective those are the next step's value and gradient:
    this returns them, and only computes ``jax.value_and_grad(value_fn)`` when
    the stored value is not finite (before the first step, or after a failed
    search). The check is a ``jax.lax.cond``, so it works under ``jit``.

    Args:
      value_fn: the objective, a real scalar function of the params (and of
        any further positional or keyword inputs).

    Returns:
      A function ``(params, *args, state, **kwargs) -> (value, grad)``. It
      raises ``ValueError`` unless ``state`` holds exactly one ``value`` and one
      ``grad`` field (e.g. a backtracking search without ``store_grad``); for
      several (a chain of two searches) the error is also a ``KeyError``, as optax's.

    >>> import jax.numpy as jnp, functrain
    >>> f = lambda w: jnp.sum(w ** 2)
    >>> opt = functrain.lbfgs()
    >>> w = jnp.array([1., 2., 3.])
    >>> state = opt.init(w)
    >>> value_and_grad = value_and_grad_from_state(f)
    >>> for _ in range(2):
    ...     value, grad = value_and_grad(w, state=state)
    ...     u, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=f)
    ...     w = functrain.apply_updates(w, u)
    ...     print(f"{f(w):.2E}")
    7.52E+00
    7.46E-14
    """
    if not callable(value_fn):
        raise TypeError(f"value_and_grad_from_state: value_fn must be a function, got "
                        f"{type(value_fn).__name__}.")

    def fetch(params: Params, *fn_args: Any, state: OptState,
              **fn_kwargs: Any) -> tuple[Array, Any]:
        stored = {}
        for name in ("value", "grad"):
            found = _find_fields(state, name)
            if len(found) != 1 or found[0][1] is None:
                where = ", ".join(p for p, _ in found) or "nowhere"
                raise (_SeveralFound if len(found) > 1 else ValueError)(
                    f"value_and_grad_from_state: the state must hold exactly one {name!r} "
                    f"(a line search's state, with store_grad=True for backtracking); "
                    f"found it {where}" + (" set to None" if found and found[0][1] is None
                                            else "") + ".")
            stored[name] = found[0][1]
        value, grad = stored["value"], stored["grad"]
        ft.check_structure(params, grad, "the state's grad", "params")

        def compute(p: Params, args: tuple, kwargs: dict) -> tuple:
            v, g = jax.value_and_grad(value_fn)(p, *args, **kwargs)
            return (jnp.asarray(v).astype(jnp.asarray(value).dtype),
                    ft.map(lambda a, b: a.astype(b.dtype), g, grad))

        return jax.lax.cond(jnp.isfinite(value), lambda p, a, k: (value, grad), compute,
                            params, fn_args, fn_kwargs)

    return fetch


__all__ = ["value_and_grad_from_state"]
