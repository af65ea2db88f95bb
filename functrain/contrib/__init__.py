"""functrain.contrib: every optimizer of ``optax.contrib``, under optax's names.

Switching is a changed import: ``optax.contrib.muon`` is ``functrain.contrib.muon``,
with the same arguments, defaults and numbers (tested step by step against
optax.contrib). The five most used are also at functrain's top level: ``muon``,
``schedule_free_adamw``, ``prodigy``, ``adopt`` and ``ademamix``.

Each module here holds one family: its per-array stages (run by functrain's
engine, like every other transform) and its named optimizers. A contrib module
may import functrain's tree, numerics, transforms, wrappers and optimizers, but
not another contrib module.

>>> import jax.numpy as jnp, functrain
>>> opt = functrain.contrib.adopt(1e-3)
>>> state = opt.init({'w': jnp.ones(3)})
"""

# Re-exports only, one block per family file.
# [area: muon]
# [end area: muon]
# [area: schedule-free and parameter-free]
# [end area: schedule-free]
# [area: adam variants]
# [end area: adam variants]
# [area: extra-args optimizers and wrappers]
# [end area: extra-args]
