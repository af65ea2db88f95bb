"""optax.losses' functions: every loss of optax 0.2.8 with its name, arguments, defaults and
numbers, written from the losses' definitions.

>>> import jax.numpy as jnp
>>> from functrain import losses
>>> losses.softmax_cross_entropy_with_integer_labels(jnp.array([[2.0, 0.5, -1.0]]),
...                                                  jnp.array([0]))
Array([0.24131131], dtype=float32)

The names optax also has at its top level are at functrain's too (``functrain.l2_loss``,
``functrain.softmax_cross_entropy``, ...); the others are here only, as in optax. Inputs are
checked before any array math: dtypes (a ``TypeError``), shapes, axes and masks (a
:class:`~functrain.losses.checks.LossInputError`, which is a ``ValueError`` and a ``TypeError``),
each error naming the loss and the argument.

* Regression (``regression.py``): ``squared_error``, ``l2_loss``, ``huber_loss``,
  ``log_cosh``, ``cosine_similarity``, ``cosine_distance``.
* Classification (``classification.py``): ``softmax_cross_entropy``,
  ``softmax_cross_entropy_with_integer_labels``, ``safe_softmax_cross_entropy``,
  ``poly_loss_cross_entropy``, ``sigmoid_binary_cross_entropy``, ``sigmoid_focal_loss``.
* Margins (``margin.py``): ``hinge_loss``, ``perceptron_loss``, ``multiclass_hinge_loss``,
  ``multiclass_perceptron_loss``, ``sparsemax_loss``, ``multiclass_sparsemax_loss``.
* Divergences (``divergences.py``): ``kl_divergence``, ``kl_divergence_with_log_targets``,
  ``generalized_kl_divergence``, ``convex_kl_divergence`` (deprecated, as in optax).
* Sequences (``ctc.py``): ``ctc_loss``, ``ctc_loss_with_forward_probs``.
* Self-supervised (``self_supervised.py``): ``ntxent``, ``triplet_margin_loss``.
* Ranking (``ranking.py``): ``ranking_softmax_loss``.
* Segmentation (``segmentation.py``): ``dice_loss``, ``binary_dice_loss``,
  ``multiclass_generalized_dice_loss``.
* Label smoothing (``smoothing.py``): ``smooth_labels``.
* Fenchel-Young losses (``fenchel_young.py``): ``make_fenchel_young_loss``.
"""

# Re-exports only.
from functrain.losses.classification import (poly_loss_cross_entropy, safe_softmax_cross_entropy,
                                             sigmoid_binary_cross_entropy, sigmoid_focal_loss,
                                             softmax_cross_entropy,
                                             softmax_cross_entropy_with_integer_labels)
from functrain.losses.ctc import ctc_loss, ctc_loss_with_forward_probs
from functrain.losses.divergences import (convex_kl_divergence, generalized_kl_divergence,
                                          kl_divergence, kl_divergence_with_log_targets)
from functrain.losses.fenchel_young import make_fenchel_young_loss
from functrain.losses.margin import (hinge_loss, multiclass_hinge_loss,
                                     multiclass_perceptron_loss, multiclass_sparsemax_loss,
                                     perceptron_loss, sparsemax_loss)
from functrain.losses.ranking import ranking_softmax_loss
from functrain.losses.regression import (cosine_distance, cosine_similarity, huber_loss,
                                         l2_loss, log_cosh, squared_error)
from functrain.losses.segmentation import (binary_dice_loss, dice_loss,
                                           multiclass_generalized_dice_loss)
from functrain.losses.self_supervised import ntxent, triplet_margin_loss
from functrain.losses.smoothing import smooth_labels

__all__ = [
    # regression
    "squared_error", "l2_loss", "huber_loss", "log_cosh", "cosine_similarity",
    "cosine_distance",
    # classification
    "softmax_cross_entropy", "softmax_cross_entropy_with_integer_labels",
    "safe_softmax_cross_entropy", "poly_loss_cross_entropy", "sigmoid_binary_cross_entropy",
    "sigmoid_focal_loss",
    # margins
    "hinge_loss", "perceptron_loss", "multiclass_hinge_loss", "multiclass_perceptron_loss",
    "sparsemax_loss", "multiclass_sparsemax_loss",
    # divergences
    "kl_divergence", "kl_divergence_with_log_targets", "generalized_kl_divergence",
    "convex_kl_divergence",
    # sequences, self-supervised, ranking, segmentation
    "ctc_loss", "ctc_loss_with_forward_probs", "ntxent", "triplet_margin_loss",
    "ranking_softmax_loss", "dice_loss", "binary_dice_loss", "multiclass_generalized_dice_loss",
    # label smoothing, Fenchel-Young
    "smooth_labels", "make_fenchel_young_loss",
]
