"""functrain.jax_compat: the JAX APIs that differ between JAX 0.5.3 and the newest, and the
error a feature that needs a newer JAX raises (named feature, named version, before any math).

Every test here runs on every supported JAX: where a feature needs a newer one, the test
checks the error on the older JAX and the numbers on the newer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import functrain
from functrain import jax_compat
from functrain.jax_compat import enable_x64
from helpers import EXPLICIT_AXES, set_mesh


def test_version_parsing_and_comparison():
    assert jax_compat._parse("0.5.3") == (0, 5, 3)
    assert jax_compat._parse("0.7.0.dev20250101") == (0, 7, 0)
    assert jax_compat._parse("1.0") == (1, 0, 0)
    assert jax_compat.JAX_VERSION == jax_compat._parse(jax.__version__)
    assert jax_compat.jax_at_least("0.5.3")  # the declared floor
    assert not jax_compat.jax_at_least("99.0.0")
    assert jax_compat.jax_at_least(jax.__version__)


def test_require_jax_names_the_feature_and_the_version():
    jax_compat.require_jax("anything", "0.5.3")
    with pytest.raises(jax_compat.NeedsNewerJaxError) as e:
        jax_compat.require_jax("time travel", "99.1.0")
    assert "time travel needs JAX >= 99.1.0" in str(e.value)
    assert f"this is JAX {jax.__version__}" in str(e.value)


def test_enable_x64_is_a_scoped_switch():
    assert not jax.config.jax_enable_x64
    with jax_compat.enable_x64():
        assert jnp.zeros(2).dtype == jnp.float64
        with jax_compat.enable_x64(False):
            assert jnp.zeros(2).dtype == jnp.float32
    assert jnp.zeros(2).dtype == jnp.float32


def test_shard_map_runs_the_function_on_each_shard():
    mesh = jax.make_mesh((1,), ("d",), axis_types=(AxisType.Auto,))
    f = jax_compat.shard_map(lambda x: x * 2 + jnp.sum(x), mesh=mesh, in_specs=(P("d"),),
                             out_specs=P("d"))
    x = jnp.arange(4.0)
    np.testing.assert_array_equal(jax.jit(f)(x), x * 2 + 6.0)


@enable_x64(True)
def test_explicit_mesh_axes_in_muon_need_jax_0_7():
    """Muon on a leaf split over an explicit mesh axis: the same numbers as unsplit where JAX
    has explicit axes (0.7.0 on); before, NeedsNewerJaxError naming the feature and version.

    In float64: the two programs differ (a mesh's sharding constraints), so their
    Newton-Schulz iterations may round differently (in float32 they differed by one ulp on
    4 of 32 entries in one run); 1e-12 is ten thousand float64 roundings."""
    mesh = jax.make_mesh((1,), ("data",), axis_types=(AxisType.Explicit,))
    w = jnp.asarray(np.random.default_rng(0).standard_normal((8, 4)), jnp.float64)
    opt = functrain.contrib.muon(1e-2)

    def step(p):
        u, _ = opt.update({"w": jnp.cos(p["w"])}, opt.init(p), p)
        return functrain.apply_updates(p, u)

    with set_mesh(mesh):
        split = {"w": jax.device_put(w, NamedSharding(mesh, P("data")))}
        if not EXPLICIT_AXES:
            with pytest.raises(jax_compat.NeedsNewerJaxError,
                               match=r"explicit mesh axes .* needs JAX >= 0\.7\.0"):
                jax.jit(step)(split)
            return
        got = jax.jit(step)(split)["w"]
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(step)({"w": w})["w"]),
                               rtol=1e-12, atol=1e-14)
