"""The JAX APIs that differ between the versions functrain supports, in one place.

functrain runs on every JAX from 0.5.3 (optax 0.2.8's floor) to the newest. Everywhere
else the library calls ``jax`` directly; the few APIs that appeared or moved after 0.5.3
are reached through this module:

* ``jax.shard_map`` (JAX 0.6.1; before, ``jax.experimental.shard_map``): :func:`shard_map`.
* ``jax.enable_x64`` (before, ``jax.experimental.enable_x64``): :func:`enable_x64`.
* Explicit mesh axes (``jax.sharding.AxisType.Explicit`` with ``jax.sharding.reshard`` and
  ``jax.sharding.auto_axes``, JAX 0.7.0): :func:`reshard` and :func:`auto_axes`, which on an
  older JAX raise :class:`NeedsNewerJaxError` naming the feature and the version it needs.
  On JAX 0.5.3-0.6.x the ``Explicit`` axis type exists but is experimental and lacks these
  functions; meshes with automatic axes (``AxisType.Auto``) work on every version.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Callable, Iterator

import jax

__all__ = ["JAX_VERSION", "EXPLICIT_AXES_JAX", "NeedsNewerJaxError", "jax_at_least",
           "require_jax", "shard_map", "enable_x64", "reshard", "auto_axes"]


def _parse(version: str) -> tuple[int, int, int]:
    parts = [int(p) for p in re.findall(r"\d+", version)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


JAX_VERSION: tuple[int, int, int] = _parse(jax.__version__)
# The first JAX with jax.sharding.reshard and jax.sharding.auto_axes (explicit mesh axes).
EXPLICIT_AXES_JAX = "0.7.0"


class NeedsNewerJaxError(RuntimeError):
    """A functrain feature needs a newer JAX than the one installed."""


def jax_at_least(version: str) -> bool:
    """Whether the installed JAX is ``version`` or newer.

    Args:
      version: a version string such as ``"0.7.0"``.

    Returns:
      ``True`` when ``jax.__version__`` is at least ``version``.

    >>> jax_at_least("0.5.3")
    True
    """
    return JAX_VERSION >= _parse(version)


def require_jax(feature: str, version: str) -> None:
    """Raise :class:`NeedsNewerJaxError` unless the installed JAX is ``version`` or newer.

    Args:
      feature: what the caller asked for, as the error names it.
      version: the first JAX version that has it.

    Returns:
      ``None``.

    >>> require_jax("anything", "0.5.3")
    """
    if not jax_at_least(version):
        raise NeedsNewerJaxError(
            f"{feature} needs JAX >= {version}; this is JAX {jax.__version__}. Upgrade JAX "
            f"(pip install -U 'jax>={version}'), or use a mesh with automatic axes "
            f"(axis_types=(jax.sharding.AxisType.Auto, ...)), which every supported JAX runs.")


_EXPLICIT = "explicit mesh axes (jax.sharding.AxisType.Explicit)"


def reshard(x: Any, sharding: Any) -> Any:
    """``jax.sharding.reshard(x, sharding)``: on a mesh with explicit axes, the split of ``x``.

    Args:
      x: an array or tracer split over explicit mesh axes.
      sharding: a ``NamedSharding`` or ``PartitionSpec``.

    Returns:
      ``x`` with that split in its type.

    Raises:
      NeedsNewerJaxError: on JAX older than :data:`EXPLICIT_AXES_JAX`.
    """
    require_jax(_EXPLICIT, EXPLICIT_AXES_JAX)
    return jax.sharding.reshard(x, sharding)


def auto_axes(fn: Callable[..., Any], *, out_sharding: Any) -> Callable[..., Any]:
    """``jax.sharding.auto_axes(fn, out_sharding=...)``: ``fn`` run with the axes automatic.

    Args:
      fn: the function.
      out_sharding: the shardings of its outputs.

    Returns:
      The wrapped function.

    Raises:
      NeedsNewerJaxError: on JAX older than :data:`EXPLICIT_AXES_JAX`.
    """
    require_jax(_EXPLICIT, EXPLICIT_AXES_JAX)
    return jax.sharding.auto_axes(fn, out_sharding=out_sharding)


def shard_map(fn: Callable[..., Any], *, mesh: Any, in_specs: Any, out_specs: Any) -> Any:
    """``fn`` mapped over the shards of its arguments on ``mesh``, without replication checks.

    ``jax.shard_map(..., check_vma=False)`` where JAX has it (0.6.1 and newer), else
    ``jax.experimental.shard_map.shard_map(..., check_rep=False)``: the same program.

    Args:
      fn: a function of the per-device shards.
      mesh: the ``jax.sharding.Mesh``.
      in_specs: a ``PartitionSpec`` per argument.
      out_specs: the outputs' ``PartitionSpec``.

    Returns:
      The mapped function.

    >>> import jax.numpy as jnp
    >>> from jax.sharding import AxisType, PartitionSpec as P
    >>> mesh = jax.make_mesh((1,), ('d',), axis_types=(AxisType.Auto,))
    >>> f = shard_map(lambda x: 2 * x, mesh=mesh, in_specs=(P('d'),), out_specs=P('d'))
    >>> print(f(jnp.arange(3.0)))
    [0. 2. 4.]
    """
    if hasattr(jax, "shard_map"):
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=False)
    from jax.experimental.shard_map import shard_map as experimental_shard_map
    return experimental_shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                  check_rep=False)


@contextlib.contextmanager
def enable_x64(new_val: bool = True) -> Iterator[None]:
    """``jax.enable_x64(new_val)`` as a context manager, on every supported JAX.

    Args:
      new_val: whether 64-bit types are enabled inside the block.

    Returns:
      A context manager.

    >>> import jax.numpy as jnp
    >>> with enable_x64():
    ...     print(jnp.zeros(1).dtype)
    float64
    """
    manager = getattr(jax, "enable_x64", None)
    if manager is None:
        from jax.experimental import enable_x64 as manager  # JAX before 0.6
    with manager(new_val):
        yield
