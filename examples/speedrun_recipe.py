"""The optimizer track's record recipe (modded-nanogpt record #46), from functrain's pieces.

Record #46 (2,690 steps to 3.28, 20.8% fewer than its tuned Muon baseline) is, in the parts
that are the optimizer's: SOAP-Muon on the hidden matrices (:func:`functrain.contrib.
scale_by_soap_muon`, its record defaults: ``b2 = 0.9``, a refresh every step, Nesterov
momentum ``0.95``), Muon's width scale, then the norm control (:func:`functrain.contrib.
scale_by_radius_pin`: radial brake ``0.5``, row floor at ``0.3825``, radius pin, post-pin
cautious weight decay ``0.025``); AdamW on the other leaves; the whole wrapped in EMA-Nesterov
(look-ahead ``0.3 lr / max_lr`` from step 300 to 1950 of 2900, EMA ``0.99``) and read out
through a tail EMA of the non-embedding weights (horizon 150 steps from step 2400, readout
``0.4 x + 0.6 EMA``). The step counts are scaled from the record's 2,900-step schedule to the
speedrun's budget. Left out, as they are not the optimizer's or the harness fixes them: the
record's learning-rate shape (PowerCool; every row here shares one multiplier), its Muon
momentum warmup, initialization changes, the attention trust gate and per-group Adam betas.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

import functrain
from functrain.families.muon.muon import scale_by_shape  # Muon's width scale, as soap_muon uses it

RECORD_STEPS = 2900  # the record's schedule length, which the step counts below scale from
LOOKAHEAD = (300, 1950, 0.3, 0.99)  # EMA-Nesterov: start, end, scale, EMA
TAIL = (2400, 150.0, 0.6)  # tail EMA: start step, horizon, readout blend
NORM_CONTROL = {"target_uw": 0.3825, "row_floor": True, "radial_outward_scale": 0.5,
                "cautious_weight_decay": 0.025}


def scaled(step: float, steps: int) -> int:
    """A step of the record's 2,900-step schedule, at the same fraction of ``steps``."""
    return int(round(step * steps / RECORD_STEPS))


def record_recipe(lr: float, adamw_lr: float, multiplier: Callable, steps: int,
                  dims: dict) -> tuple:
    """The recipe at peak rate ``lr`` (the matrices') and ``adamw_lr`` (the other leaves).

    Args:
      lr: the matrices' peak learning rate.
      adamw_lr: the other leaves' peak learning rate.
      multiplier: the learning-rate multiplier, a function of the step count.
      steps: the step budget (the record's step counts scale to it).
      dims: Muon's dimension numbers per leaf (``None``: an AdamW leaf).

    Returns:
      ``(optimizer, eval_params)``: ``eval_params(state, params)`` is where to evaluate.
    """
    is_dims = lambda d: d is None or isinstance(d, functrain.contrib.MuonDimensionNumbers)  # noqa: E731
    labels = jax.tree.map(lambda d: "adam" if d is None else "matrix", dims, is_leaf=is_dims)

    matrix = functrain.chain(
        functrain.contrib.scale_by_soap_muon(weight_dimension_numbers=dims),
        scale_by_shape(dims, None),  # Muon's sqrt(max(1, fan_out / fan_in))
        functrain.contrib.scale_by_radius_pin(lambda c: lr * multiplier(c),
                                              weight_dimension_numbers=dims, **NORM_CONTROL))
    adam = functrain.adamw(lambda c: adamw_lr * multiplier(c), weight_decay=0.0, nesterov=True)
    inner = functrain.partition({"matrix": matrix, "adam": adam}, labels)
    start, end, scale, ema = LOOKAHEAD
    start, end = scaled(start, steps), scaled(end, steps)

    def lookahead(count):
        on = (count >= start) & (count < end)
        return jnp.where(on, scale * multiplier(count), 0.0)

    wrapped = functrain.contrib.ema_nesterov(inner, lookahead, lookahead_ema=ema)
    tail_start, horizon, blend = TAIL
    not_embedding = {k: k not in ("tok_embed", "pos_embed") for k in dims}
    opt = functrain.contrib.tail_ema(wrapped, tau=max(1.0, horizon * steps / RECORD_STEPS),
                                     start_step=scaled(tail_start, steps), blend=blend,
                                     mask=lambda p: {k: jax.tree.map(lambda _: v, p[k])
                                                     for k, v in not_embedding.items()})

    def eval_params(state, params):
        weights = functrain.contrib.ema_nesterov_eval_params(state.inner_state, params)
        return functrain.contrib.tail_ema_eval_params(state, weights)

    return opt, eval_params
