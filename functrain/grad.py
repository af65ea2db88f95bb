"""Gradient functions with the names and signatures of Ivy's gradients API.

``grad``, ``value_and_grad``, ``jac``, ``execute_with_gradients`` and
``stop_gradient`` are here so that code written against Ivy (and MLX's or
MXNet's ``stop_gradient``) finds every function under the same name, working
on JAX arrays and any pytree.  They are thin layers over :func:`jax.grad`,
:func:`jax.value_and_grad`, :func:`jax.jacrev` and
:func:`jax.lax.stop_gradient`, so they compose with ``jax.jit``, ``jax.vmap``
and each other.

``functrain.grad`` is the function :func:`grad` (``functrain/__init__.py`` imports it
over the submodule's name, as ``jax.grad`` is a function); the module's other functions
are at the top level too (``functrain.value_and_grad``), or import them from here:
``from functrain.grad import value_and_grad``.

>>> import jax.numpy as jnp, functrain
>>> print(functrain.grad(lambda x: jnp.sum(x ** 2))(jnp.array([1., 2.])))
[2. 4.]
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
from jax import tree_util

from functrain import tree as ft

__all__ = [
    "grad",
    "value_and_grad",
    "jac",
    "execute_with_gradients",
    "stop_gradient",
]

#: An array, or a pytree whose leaves are arrays.
ArrayTree = Any
#: A path into a pytree: a sequence of list/tuple positions, dict keys or
#: attribute (NamedTuple field) names, e.g. ``(0,)`` or ``('encoder', 'w')``.
IndexPath = Sequence[Hashable]


# --------------------------------------------------------------------------
# grad / value_and_grad / jac
# --------------------------------------------------------------------------


def grad(func: Callable[..., Any], argnums: Union[int, Sequence[int]] = 0) -> Callable[..., Any]:
    """The gradient of a scalar function, by reverse mode (:func:`jax.grad`).

    Args:
      func: a function returning a scalar.
      argnums: which positional argument(s) to differentiate with respect to.

    Returns:
      A function taking ``func``'s arguments and returning the gradient, with
      the structure of the differentiated argument(s).

    Example (seed 001):

    >>> import jax.numpy as jnp
    >>> from functrain.grad import grad
    >>> x = jnp.array([[4.6, 2.1, 5], [2.8, 1.3, 6.2]])
    >>> grad_fn = grad(lambda x: jnp.mean(jnp.square(x)))
    >>> print(grad_fn(x))
    [[1.53  0.7   1.67 ]
     [0.933 0.433 2.07 ]]
    """
    return jax.grad(func, argnums=argnums)


def value_and_grad(
    func: Callable[..., Any],
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
) -> Callable[..., Any]:
    """The value and the gradient of a scalar function (:func:`jax.value_and_grad`).

    Args:
      func: a function returning a scalar, or ``(scalar, aux)`` if ``has_aux``.
      argnums: which positional argument(s) to differentiate with respect to.
      has_aux: whether ``func`` returns auxiliary data beside the scalar.

    Returns:
      A function returning ``(value, gradient)``, or
      ``((value, aux), gradient)`` if ``has_aux``.

    Example (seed 001):

    >>> import jax.numpy as jnp
    >>> from functrain.grad import value_and_grad
    >>> x = jnp.array([[4.6, 2.1, 5], [2.8, 1.3, 6.2]])
    >>> value, g = value_and_grad(lambda x: jnp.mean(jnp.square(x)))(x)
    >>> print(value)
    16.42333
    >>> print(g)
    [[1.5333333  0.7        1.6666666 ]
     [0.93333334 0.43333334 2.0666666 ]]
    """
    return jax.value_and_grad(func, argnums=argnums, has_aux=has_aux)


def jac(func: Callable[..., Any], argnums: Union[int, Sequence[int]] = 0) -> Callable[..., Any]:
    """The Jacobian of a function, by reverse mode (:func:`jax.jacrev`).

    The result has the output's shape followed by the input's shape (for
    pytrees: the output's tree with, at each leaf, the input's tree).

    Args:
      func: the function to differentiate.
      argnums: which positional argument(s) to differentiate with respect to.

    Returns:
      A function taking ``func``'s arguments and returning the Jacobian.

    Example (seed 001, then a vector-valued function):

    >>> import jax.numpy as jnp
    >>> from functrain.grad import jac
    >>> x = jnp.array([[4.6, 2.1, 5], [2.8, 1.3, 6.2]])
    >>> print(jac(lambda x: jnp.mean(jnp.square(x)))(x))
    [[1.53  0.7   1.67 ]
     [0.933 0.433 2.07 ]]
    >>> print(jac(lambda v: v ** 2)(jnp.array([1., 2.])))
    [[2. 0.]
     [0. 4.]]
    """
    return jax.jacrev(func, argnums=argnums)


# --------------------------------------------------------------------------
# stop_gradient
# --------------------------------------------------------------------------


def _stop_leaf(x: Any) -> Any:
    # JAX arrays (tracers included) are stopped.  Anything else (numpy arrays,
    # Python numbers, strings) is a constant to JAX: no gradient to stop, so
    # it is returned as it is, type unchanged.
    return jax.lax.stop_gradient(x) if isinstance(x, jax.Array) else x


def stop_gradient(x: ArrayTree, *, preserve_type: bool = True) -> ArrayTree:
    """The identity in the forward pass; no gradient flows back through it.

    Works on a single array or on any pytree of arrays
    (:func:`jax.lax.stop_gradient` on each leaf).

    Args:
      x: an array or a pytree of arrays.
      preserve_type: accepted for compatibility with Ivy and has no effect:
        JAX arrays carry no "variable" type to preserve or drop.

    Returns:
      ``x``, unchanged in value, with its gradient stopped.

    Examples (seed 000, and MXNet's ``stop_gradient`` example):

    >>> import jax, jax.numpy as jnp
    >>> from functrain.grad import stop_gradient
    >>> print(stop_gradient(jnp.array([1., 2., 3.]), preserve_type=True))
    [1. 2. 3.]
    >>> y = stop_gradient({'a': jnp.array([0., 1., 2.]), 'b': jnp.array([3., 4., 5.])})
    >>> print(y['a'], y['b'])
    [0. 1. 2.] [3. 4. 5.]
    >>> loss = lambda a, b: stop_gradient(3 * b) + a
    >>> a, b = jnp.array([1., 2.]), jnp.array([0., 1.])
    >>> print(loss(a, b))
    [1. 5.]
    >>> print(*jax.grad(lambda a, b: jnp.sum(loss(a, b)), argnums=(0, 1))(a, b))
    [1. 1.] [0. 0.]
    """
    del preserve_type  # No variable types in JAX; see the docstring.
    return tree_util.tree_map(_stop_leaf, x)


# --------------------------------------------------------------------------
# execute_with_gradients
# --------------------------------------------------------------------------


def _normalize_paths(
    tree: Any, idxs: Optional[Sequence[IndexPath]], arg_name: str, tree_name: str
) -> Optional[Tuple[Tuple[Hashable, ...], ...]]:
    """Check ``idxs`` against ``tree``; None means "the whole tree"."""
    if idxs is None:
        return None
    if isinstance(idxs, (str, bytes)) or not isinstance(idxs, Sequence):
        raise TypeError(f"{arg_name} must be None or a sequence of paths such as ((0,),), got {idxs!r}")
    paths = []
    for p in idxs:
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence):
            raise TypeError(
                f"{arg_name} must be a sequence of paths (each a sequence of keys, "
                f"e.g. ((0,), ('w',))), got the entry {p!r}"
            )
        paths.append(tuple(p))
    paths = tuple(paths)
    if not paths:
        raise ValueError(f"{arg_name} selects nothing; pass None to select all of {tree_name}")
    if paths == ((0,),) and (ft.is_single_leaf(tree) or isinstance(tree, Mapping)):
        # Ivy's rule: for a single array or a Container (here: a mapping) the
        # default ((0,),) means "everything".
        return None
    for i, a in enumerate(paths):
        for b in paths[i + 1:]:
            if a[: len(b)] == b or b[: len(a)] == a:
                raise ValueError(f"{arg_name}: paths {a!r} and {b!r} overlap")
    for p in paths:
        ft.get_path(tree, p, f"{arg_name} path {p!r} into {tree_name}")
    return paths


def _promote_to_float(tree: Any) -> Any:
    """Leaves as arrays, integer (and bool) arrays cast to the default float."""
    default_float = jnp.result_type(float)

    def promote(x: Any) -> Any:
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(default_float)
        return x

    return tree_util.tree_map(promote, tree)


def execute_with_gradients(
    func: Callable[[Any], Any],
    xs: ArrayTree,
    *,
    retain_grads: bool = False,
    xs_grad_idxs: Optional[Sequence[IndexPath]] = ((0,),),
    ret_grad_idxs: Optional[Sequence[IndexPath]] = ((0,),),
) -> Tuple[Any, Any]:
    """Call ``func(xs)`` and return its result with its gradients (Jacobian).

    ``grads`` is the reverse-mode Jacobian of the selected outputs with
    respect to the selected inputs: for a scalar output it is the gradient,
    with the structure of the selected inputs; for a pytree of outputs it is
    that tree with, at each output leaf, a tree of the selected inputs (so
    ``grads[out_key][in_key]``).

    Selecting inputs and outputs.  A *path* is a sequence of keys walking
    into a pytree: list/tuple positions, dict keys, NamedTuple field names
    (or positions).  ``(0,)`` is ``xs[0]``; ``(1, 'w')`` is ``xs[1]['w']``.

    * ``xs_grad_idxs``: ``None`` differentiates with respect to all of ``xs``
      and ``grads`` mirrors ``xs``.  A sequence holding one path
      differentiates with respect to that sub-tree only, and ``grads``
      mirrors that sub-tree (no wrapping).  Several paths (which must not
      overlap) give a tuple with one entry per path, in the given order.
      Everything not selected is passed to ``func`` unchanged and treated as
      a constant.  As in Ivy, the default ``((0,),)`` means "all of ``xs``"
      when ``xs`` is a single array or a mapping (Ivy's ``Container``), and
      ``xs[0]`` when ``xs`` is a list or tuple.
    * ``ret_grad_idxs`` selects the outputs the same way in ``func(xs)``:
      ``None`` for all of it; one path for that sub-tree (for a function
      returning ``(loss, aux)`` the default picks ``loss``); several paths
      for a tuple.  The default ``((0,),)`` means "all of the result" when
      ``func`` returns a single array or a mapping.  Outputs that are not
      selected may be anything (strings, integers): they are returned, not
      differentiated.

    Selected integer inputs are promoted to the default float dtype (so the
    gradient exists), and ``func`` sees the promoted values.

    Args:
      func: a function of one argument, ``xs``.
      xs: an array or a pytree of arrays.
      retain_grads: if False (the default), ``func_ret`` and ``grads`` are
        returned with their gradient stopped; if True they stay connected,
        so an outer transformation can differentiate through them
        (second-order derivatives).
      xs_grad_idxs: paths of the inputs to differentiate with respect to, or
        None for all.
      ret_grad_idxs: paths of the outputs to differentiate, or None for all.

    Returns:
      ``(func_ret, grads)``: the whole result of ``func(xs)``, and the
      gradients as described above.

    Examples (seed 001's two, then index selection):

    >>> import jax, jax.numpy as jnp
    >>> from functrain.grad import execute_with_gradients
    >>> f = lambda x: jnp.mean(jnp.square(x))
    >>> ret, g = execute_with_gradients(f, jnp.array([[1, 4, 6], [2, 6, 9]]))
    >>> print(ret)
    29.0
    >>> print(g)
    [[0.33333334 1.3333334  2.        ]
     [0.6666667  2.         3.        ]]
    >>> xs = {'a': jnp.array([1, 4, 6]), 'b': jnp.array([2, 6, 9])}
    >>> ret, g = execute_with_gradients(lambda x: jax.tree.map(f, x), xs)
    >>> print(ret['a'], ret['b'])
    17.66667 40.33333
    >>> print(g['a']['a'], g['a']['b'])
    [0.6666667 2.6666667 4.       ] [0. 0. 0.]

    A list of inputs and a ``(loss, aux)`` result: by default the gradient
    of ``ret[0]`` with respect to ``xs[0]``:

    >>> def loss(p):
    ...     w, b = p
    ...     out = jnp.sum(w * 2.0 + b)
    ...     return out, {'out': out}
    >>> p = [jnp.array([1., 2.]), jnp.asarray(3., dtype=jnp.float32)]
    >>> (value, aux), g = execute_with_gradients(loss, p)
    >>> print(value, g)
    12.0 [2. 2.]
    >>> _, g = execute_with_gradients(loss, p, xs_grad_idxs=((0,), (1,)))
    >>> type(g).__name__, g[0], g[1]  # one entry per path
    ('tuple', Array([2., 2.], dtype=float32), Array(2., dtype=float32))
    >>> _, g = execute_with_gradients(loss, p, xs_grad_idxs=None,
    ...                               ret_grad_idxs=((1, 'out'),))
    >>> type(g).__name__, g[0], g[1]  # mirrors xs
    ('list', Array([2., 2.], dtype=float32), Array(2., dtype=float32))
    """
    x_paths = _normalize_paths(xs, xs_grad_idxs, "xs_grad_idxs", "xs")

    if x_paths is None:
        xs = _promote_to_float(xs)
        primal = xs

        def rebuild(p: Any) -> Any:
            return p

    else:
        for path in x_paths:
            xs = ft.set_path(xs, path, _promote_to_float(ft.get_path(xs, path, "xs")))
        base = xs
        if len(x_paths) == 1:
            primal = ft.get_path(xs, x_paths[0], "xs")

            def rebuild(p: Any) -> Any:
                return ft.set_path(base, x_paths[0], p)

        else:
            primal = tuple(ft.get_path(xs, path, "xs") for path in x_paths)

            def rebuild(p: Any) -> Any:
                out = base
                for path, value in zip(x_paths, p):
                    out = ft.set_path(out, path, value)
                return out

    def selected_output(p: Any) -> Tuple[Any, Any]:
        ret = func(rebuild(p))
        r_paths = _normalize_paths(ret, ret_grad_idxs, "ret_grad_idxs", "func's result")
        if r_paths is None:
            chosen = ret
        elif len(r_paths) == 1:
            chosen = ft.get_path(ret, r_paths[0], "func's result")
        else:
            chosen = tuple(ft.get_path(ret, path, "func's result") for path in r_paths)
        return chosen, ret

    grads, func_ret = jax.jacrev(selected_output, has_aux=True)(primal)
    if not retain_grads:
        func_ret = stop_gradient(func_ret)
        grads = stop_gradient(grads)
    return func_ret, grads
