"""functrain.contrib's MuonClip: qk_clip and muon_clip (Kimi Team, 2025, arXiv 2507.20534; no
optax counterpart).

Compared with: the clip rule written out in numpy float64 (for each head whose max logit ``S``
passed ``tau``, ``gamma = tau / S``, the stepped query weights of the head times
``gamma**alpha``, the key weights times ``gamma**(1 - alpha)``), on fused, per-head and
stacked layouts; muon_clip as functrain.contrib.muon's own step (checked against optax in
test_contrib_muon.py) followed by that numpy clip. And what the paper claims, on a small
attention model trained with a high learning rate: without the clip its max attention logit
grows far past ``tau``; with it, each clipped head's logits shrink by exactly ``gamma``, and
the max logit stays near ``tau``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import QKClipLayer, muon, muon_clip, qk_clip
from functrain.jax_compat import enable_x64

TAU = 10.0


# --------------------------------------------------------------------------
# The rule in numpy
# --------------------------------------------------------------------------

def np_clip_leaf(w, logits, tau, share, head_axis, num_heads=None, layer_axis=None):
    """``w`` (float64) with each head's entries times ``(tau / S)**share`` where ``S > tau``,
    written head by head with explicit index slices."""
    w = np.array(w, np.float64)
    logits = np.asarray(logits, np.float64)
    head_axis %= w.ndim
    size = 1 if num_heads is None else w.shape[head_axis] // num_heads
    stacks = [None] if layer_axis is None else range(w.shape[layer_axis])
    for layer in stacks:
        row = logits if layer is None else logits[layer]
        for h, s in enumerate(row):
            if s > tau:
                index = [slice(None)] * w.ndim
                index[head_axis] = slice(h * size, (h + 1) * size)
                if layer is not None:
                    index[layer_axis] = layer
                w[tuple(index)] *= (tau / s) ** share
    return w


# Two layers of 4 heads (one fused, one with a head axis, in a list), a stacked pair of
# layers (3 layers, 4 fused heads), and two leaves no layer names.
LAYERS = {
    "fused": QKClipLayer(("fused", "wq"), ("fused", "wk"), num_heads=4),
    "split": QKClipLayer("split/0", "split/1", head_axis=1),
    "stack": QKClipLayer("stack/wq", "stack/wk", num_heads=4, layer_axis=0),
}
SHAPES = {"fused": (6, 12), "split": (6, 4, 3), "stack": (3, 6, 8)}
LOGITS = {  # heads above tau, below it, and at it (untouched)
    "fused": np.array([40.0, 3.0, 12.5, TAU]),
    "split": np.array([2.0, 100.0, 9.99, 25.0]),
    "stack": np.array([[11.0, 1.0, 1.0, 30.0], [1.0, 1.0, 1.0, 1.0], [5.0, 50.0, 20.0, 0.5]]),
}


def tree_problem(seed=0):
    rng = np.random.default_rng(seed)

    def draw(shape):
        return rng.standard_normal(shape)

    params = {"fused": {"wq": draw(SHAPES["fused"]), "wk": draw(SHAPES["fused"])},
              "split": [draw(SHAPES["split"]), draw(SHAPES["split"])],
              "stack": {"wq": draw(SHAPES["stack"]), "wk": draw(SHAPES["stack"])},
              "emb": draw((5, 6)), "bias": draw(6)}
    updates = jax.tree.map(lambda x: 0.1 * draw(np.shape(x)), params)
    return params, updates


def np_reference(params, updates, tau, alpha):
    """The stepped params ``p + u``, then each layer's query and key clipped."""
    out = jax.tree.map(lambda p, u: np.asarray(p) + np.asarray(u), params, updates)
    for name, layer in LAYERS.items():
        for path, share in ((layer.query, alpha), (layer.key, 1 - alpha)):
            keys = path if isinstance(path, tuple) else tuple(path.split("/"))
            node = out
            for k in keys[:-1]:
                node = node[int(k) if isinstance(node, list) else k]
            last = int(keys[-1]) if isinstance(node, list) else keys[-1]
            node[last] = np_clip_leaf(node[last], LOGITS[name], tau, share, layer.head_axis,
                                      layer.num_heads, layer.layer_axis)
    return out


@pytest.mark.parametrize("alpha", [0.5, 0.25, 0.0, 1.0])
def test_qk_clip_matches_the_rule_in_numpy(alpha):
    with enable_x64(True):
        params, updates = tree_problem()
        params, updates = (jax.tree.map(jnp.asarray, t) for t in (params, updates))
        tx = qk_clip(TAU, alpha, layers=LAYERS)
        got, state = jax.jit(tx.update)(updates, tx.init(params), params,
                                         attention_logits=LOGITS)
        assert state == functrain.EmptyState()
        stepped = functrain.apply_updates(params, got)
        want = np_reference(params, updates, TAU, alpha)
        for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(stepped),
                                jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(x), y, rtol=1e-13, atol=1e-15,
                                       err_msg=jax.tree_util.keystr(path))
        # Leaves no layer names, and heads at or below tau, keep their update bit for bit.
        for k in ("emb", "bias"):
            np.testing.assert_array_equal(got[k], updates[k])
        np.testing.assert_array_equal(got["fused"]["wq"][:, 3:6], updates["fused"]["wq"][:, 3:6])
        np.testing.assert_array_equal(got["fused"]["wk"][:, 9:], updates["fused"]["wk"][:, 9:])
        np.testing.assert_array_equal(got["split"][0][:, 0], updates["split"][0][:, 0])
        np.testing.assert_array_equal(got["split"][1][:, 2], updates["split"][1][:, 2])
        np.testing.assert_array_equal(got["stack"]["wq"][1], updates["stack"]["wq"][1])
        np.testing.assert_array_equal(got["stack"]["wk"][0, :, 2:6],
                                      updates["stack"]["wk"][0, :, 2:6])


def test_each_clipped_head_s_logits_shrink_by_gamma():
    """What the clip is for: every logit ``(x W_q^h) . (x W_k^h)`` of a head with ``S > tau``
    is multiplied by ``gamma = tau / S``, whatever ``alpha``; the other heads' are unchanged."""
    with enable_x64(True):
        params, updates = tree_problem(seed=3)
        x = np.random.default_rng(4).standard_normal((7, 6))
        for alpha in (0.5, 0.3):
            tx = qk_clip(TAU, alpha, layers=LAYERS)
            u, _ = tx.update(jax.tree.map(jnp.asarray, updates), tx.init(params), params,
                             attention_logits=LOGITS)
            before = jax.tree.map(lambda p, v: np.asarray(p) + np.asarray(v), params, updates)
            after = functrain.apply_updates(params, u)
            for h, s in enumerate(LOGITS["fused"]):
                cols = slice(3 * h, 3 * h + 3)

                def logits(t):
                    w = t["fused"]
                    return (x @ np.asarray(w["wq"])[:, cols]) @ (x @ np.asarray(w["wk"])[:, cols]).T

                gamma = min(1.0, TAU / s)
                np.testing.assert_allclose(logits(after), gamma * logits(before), rtol=1e-12)


def test_layers_as_a_function_of_the_params_and_in_a_chain():
    """``layers`` may be a function of the params (here: every dict holding 'wq' and 'wk');
    the clip then acts on what the chain before it stepped to."""
    def find(params):
        return {name: QKClipLayer((name, "wq"), (name, "wk"), num_heads=2)
                for name, node in params.items() if isinstance(node, dict) and "wq" in node}

    params = {"a": {"wq": jnp.ones((2, 4)), "wk": jnp.ones((2, 4))}, "w": jnp.ones(3)}
    grads = jax.tree.map(jnp.ones_like, params)
    tx = functrain.chain(functrain.sgd(0.5), qk_clip(4.0, layers=find))
    u, _ = tx.update(grads, tx.init(params), params,
                     attention_logits={"a": jnp.array([16.0, 1.0])})
    new = functrain.apply_updates(params, u)
    np.testing.assert_allclose(new["a"]["wq"], [[0.25, 0.25, 0.5, 0.5]] * 2, rtol=1e-6)
    np.testing.assert_allclose(new["a"]["wk"], [[0.25, 0.25, 0.5, 0.5]] * 2, rtol=1e-6)
    np.testing.assert_allclose(new["w"], 0.5)


def test_bfloat16_leaves_are_clipped_in_float32_and_keep_their_dtype():
    params = {"wq": jnp.ones((2, 4), jnp.bfloat16), "wk": jnp.ones((2, 4), jnp.bfloat16)}
    tx = qk_clip(1.0, layers={"l": QKClipLayer("wq", "wk", num_heads=2)})
    u, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params,
                     attention_logits={"l": jnp.array([4.0, 0.5])})
    assert u["wq"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(u["wq"], np.float32), [[-0.5, -0.5, 0, 0]] * 2)


# --------------------------------------------------------------------------
# muon_clip: muon's step, then the numpy clip
# --------------------------------------------------------------------------

def test_muon_clip_is_muon_then_the_clip_over_steps():
    """Four float64 steps, weight decay on (so the params enter Muon's step): muon_clip's
    params equal functrain.contrib.muon's update applied to the same params, clipped in
    numpy with that step's logits (some heads above tau, some below)."""
    layers = {"attn": QKClipLayer("attn/wq", "attn/wk", num_heads=2)}
    kwargs = dict(learning_rate=0.05, weight_decay=0.1, adam_learning_rate=0.01)
    with enable_x64(True):
        rng = np.random.default_rng(5)
        params = {"attn": {"wq": jnp.asarray(rng.standard_normal((8, 6))),
                           "wk": jnp.asarray(rng.standard_normal((8, 6)))},
                  "w": jnp.asarray(rng.standard_normal((8, 5))),
                  "b": jnp.asarray(rng.standard_normal(5))}
        logits = [np.array([30.0, 2.0]), np.array([5.0, 12.0]), np.array([1.0, 1.0]),
                  np.array([50.0, 400.0])]
        opt = muon_clip(**kwargs, tau=TAU, alpha=0.4, qk_layers=layers)
        base = muon(**kwargs)
        step = jax.jit(lambda g, s, p, s_max: opt.update(g, s, p, attention_logits=s_max))
        state, base_state, ref = opt.init(params), base.init(params), params
        for t, s_max in enumerate(logits):
            grads = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape)), params)
            u, state = step(grads, state, params, {"attn": jnp.asarray(s_max)})
            params = functrain.apply_updates(params, u)
            v, base_state = base.update(grads, base_state, ref)
            stepped = jax.tree.map(lambda p, x: np.asarray(p) + np.asarray(x), ref, v)
            stepped["attn"]["wq"] = np_clip_leaf(stepped["attn"]["wq"], s_max, TAU, 0.4, -1, 2)
            stepped["attn"]["wk"] = np_clip_leaf(stepped["attn"]["wk"], s_max, TAU, 0.6, -1, 2)
            for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(stepped)):
                np.testing.assert_allclose(np.asarray(x), y, rtol=1e-10, atol=1e-12,
                                           err_msg=f"step {t}")
            ref = jax.tree.map(jnp.asarray, stepped)


# --------------------------------------------------------------------------
# The demo: a small attention model whose logits grow under Muon
# --------------------------------------------------------------------------

VOCAB, SEQ, D_MODEL, HEADS, HEAD_DIM, BATCH = 16, 16, 32, 4, 8, 32
CAUSAL = np.tril(np.ones((SEQ, SEQ), bool))
DEMO_TAU, DEMO_LR, DEMO_STEPS = 30.0, 0.05, 150


def attention_model(key):
    ks = jax.random.split(key, 7)
    scale = 1 / np.sqrt(D_MODEL)
    return {"emb": jax.random.normal(ks[0], (VOCAB, D_MODEL)),
            "pos": jax.random.normal(ks[1], (SEQ, D_MODEL)),
            "attn": {n: scale * jax.random.normal(k, (D_MODEL, HEADS * HEAD_DIM))
                     for n, k in zip(("wq", "wk", "wv", "wo"), ks[2:6])},
            "head": scale * jax.random.normal(ks[6], (D_MODEL, VOCAB))}


def forward(params, tokens):
    """Next-token logits and each head's max pre-softmax attention logit (causal positions)."""
    a = params["attn"]
    x = params["emb"][tokens] + params["pos"]
    q, k, v = ((x @ a[n]).reshape(*tokens.shape, HEADS, HEAD_DIM) for n in ("wq", "wk", "wv"))
    s = jnp.where(CAUSAL, jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HEAD_DIM), -jnp.inf)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    x = x + o.reshape(*tokens.shape, HEADS * HEAD_DIM) @ a["wo"]
    return x @ params["head"], {"attn": jnp.max(s, axis=(0, 2, 3))}


def copy_loss(params, tokens):
    """Predict the token three places back (an attention task); aux: the max logits."""
    logits, s_max = forward(params, tokens)
    target = jnp.roll(tokens, 3, axis=1)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), target[..., None], -1)[..., 0]
    return jnp.mean(nll[:, 3:]), s_max


def train(opt):
    """``DEMO_STEPS`` jitted steps on fresh random batches: the final params and loss, and
    per step the max logits the forward pass measured (passed to ``update``) and those of the
    new weights on the same batch."""
    @jax.jit
    def step(params, state, tokens):
        (loss, s_max), grads = jax.value_and_grad(copy_loss, has_aux=True)(params, tokens)
        updates, state = opt.update(grads, state, params, attention_logits=s_max)
        new = functrain.apply_updates(params, updates)
        return new, state, loss, s_max["attn"], forward(new, tokens)[1]["attn"]

    params = attention_model(jax.random.PRNGKey(0))
    state, key, measured, after = opt.init(params), jax.random.PRNGKey(1), [], []
    for _ in range(DEMO_STEPS):
        key, sub = jax.random.split(key)
        params, state, loss, s_max, s_after = step(params, state, jax.random.randint(
            sub, (BATCH, SEQ), 0, VOCAB))
        measured.append(np.asarray(s_max))
        after.append(np.asarray(s_after))
    return params, float(loss), np.array(measured), np.array(after)


def test_demo_the_clip_holds_a_small_attention_model_s_max_logit_at_tau():
    """One causal self-attention layer (d_model 32, 4 heads, sequence 16) learns to copy the
    token three places back with Muon at a high learning rate (0.05, 150 steps). Without the
    clip its max attention logit grows from about 11 to ~200, far past tau = 30; with it:

    - every step, each head's logits on that step's batch, recomputed with the new weights,
      are ``gamma`` times those of the same Muon step unclipped (``gamma = tau / S`` for a
      head whose measured ``S`` passed tau, else 1): the mechanism, exactly;
    - the max logit any forward pass sees stays within one step's growth of tau (under
      1.3 tau here), and the task is still learned;
    - at the end, ``qk_clip`` alone with the logits measured at the final weights brings the
      recomputed max logit on that batch to tau (to float32 rounding).
    """
    layers = {"attn": QKClipLayer(("attn", "wq"), ("attn", "wk"), num_heads=HEADS)}
    _, plain_loss, plain, _ = train(muon(DEMO_LR))
    params, clip_loss, clipped, after = train(muon_clip(DEMO_LR, tau=DEMO_TAU,
                                                        qk_layers=layers))
    assert plain.max() > 5 * DEMO_TAU, plain.max()            # ~200 without the clip
    assert clipped.max() < 1.3 * DEMO_TAU, clipped.max()       # ~37.5 with it
    assert after.max() < 1.2 * DEMO_TAU, after.max()
    assert clip_loss < 0.2 and plain_loss < 0.5, (clip_loss, plain_loss)

    # The mechanism on one step of the clipped run: clip(p + u) vs p + u on the same batch.
    tokens = jax.random.randint(jax.random.PRNGKey(7), (BATCH, SEQ), 0, VOCAB)
    base = muon(DEMO_LR)
    (_, s_max), grads = jax.value_and_grad(copy_loss, has_aux=True)(params, tokens)
    u, _ = base.update(grads, base.init(params), params)
    stepped = functrain.apply_updates(params, u)
    clip = qk_clip(DEMO_TAU, layers=layers)
    v, _ = clip.update(u, clip.init(params), params, attention_logits=s_max)
    gamma = np.minimum(1.0, DEMO_TAU / np.asarray(s_max["attn"]))
    assert (gamma < 1).any()
    np.testing.assert_allclose(forward(functrain.apply_updates(params, v), tokens)[1]["attn"],
                               gamma * forward(stepped, tokens)[1]["attn"], rtol=1e-4)

    # The clip alone, with the logits measured at the weights it clips: exactly tau.
    s_now = forward(stepped, tokens)[1]
    assert float(s_now["attn"].max()) > DEMO_TAU
    zero = jax.tree.map(jnp.zeros_like, stepped)
    w, _ = clip.update(zero, clip.init(stepped), stepped, attention_logits=s_now)
    s_clipped = forward(functrain.apply_updates(stepped, w), tokens)[1]["attn"]
    np.testing.assert_allclose(s_clipped, np.minimum(s_now["attn"], DEMO_TAU), rtol=1e-5)


# --------------------------------------------------------------------------
# inject_hyperparams, jit, errors
# --------------------------------------------------------------------------

def test_inject_hyperparams_with_a_traced_tau():
    """tau lives in the state: changing it between jitted steps needs no recompile and gives
    muon_clip's numbers at the new tau."""
    layers = {"attn": QKClipLayer("wq", "wk", num_heads=2)}
    params = {"wq": jnp.ones((4, 4)) + jnp.eye(4), "wk": jnp.ones((4, 4)), "b": jnp.zeros(4)}
    grads = {"wq": jnp.eye(4), "wk": -jnp.eye(4), "b": jnp.ones(4)}
    s_max = {"attn": jnp.array([60.0, 20.0])}
    opt = functrain.inject_hyperparams(muon_clip)(learning_rate=0.02, tau=30.0, alpha=0.5,
                                                  qk_layers=layers)
    state = opt.init(params)
    assert set(state.hyperparams) >= {"learning_rate", "tau", "alpha"}
    traces = []

    @jax.jit
    def step(state):
        traces.append(1)
        return opt.update(grads, state, params, attention_logits=s_max)[0]

    for tau in (30.0, 10.0):
        state.hyperparams["tau"] = jnp.asarray(tau, jnp.float32)
        plain = muon_clip(0.02, tau=tau, qk_layers=layers)
        want = plain.update(grads, plain.init(params), params, attention_logits=s_max)[0]
        for k in params:
            np.testing.assert_allclose(step(state)[k], want[k], rtol=2e-5, atol=1e-7)
    assert len(traces) == 1


def test_bad_arguments_are_named():
    layers = {"attn": QKClipLayer("wq", "wk", num_heads=2)}
    with pytest.raises(ValueError, match="qk_clip: tau must be > 0"):
        qk_clip(0.0, layers=layers)
    with pytest.raises(ValueError, match=r"qk_clip: alpha must be in \[0.0, 1.0\]"):
        qk_clip(10.0, 1.5, layers=layers)
    with pytest.raises(ValueError, match="muon_clip: tau must be > 0"):
        muon_clip(0.1, tau=-1.0, qk_layers=layers)
    with pytest.raises(ValueError, match="muon: beta"):
        muon_clip(0.1, beta=1.5, qk_layers=layers)
    with pytest.raises(TypeError, match=r"qk_clip: layers\['attn'\] must be a QKClipLayer"):
        qk_clip(layers={"attn": ("wq", "wk")})
    with pytest.raises(TypeError, match="qk_clip: layers must be a dict"):
        qk_clip(layers=[QKClipLayer("wq", "wk")])
    with pytest.raises(TypeError, match="qk_layers"):
        muon_clip(0.1)  # no qk_layers: Python names the missing argument

    params = {"wq": jnp.ones((3, 4)), "wk": jnp.ones((3, 4))}
    tx = qk_clip(10.0, layers=layers)
    state = tx.init(params)
    good = {"attn": jnp.ones(2)}

    def call(logits=good, p=params, spec=None, **kw):
        t = tx if spec is None else qk_clip(10.0, layers=spec)
        return t.update(params, state, p, **({"attention_logits": logits} if logits is not None
                                             else {}), **kw)

    with pytest.raises(TypeError, match="qk_clip needs the keyword argument 'attention_logits'"):
        call(logits=None)
    with pytest.raises(ValueError, match="qk_clip needs the current parameters"):
        call(p=None)
    with pytest.raises(ValueError, match=r"attention_logits names layer\(s\) \['mlp'\]"):
        call(logits={"attn": jnp.ones(2), "mlp": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"attention_logits has no entry for layer\(s\) "
                                         r"\['attn'\]"):
        call(logits={})
    with pytest.raises(ValueError, match=r"attention_logits\['attn'\] has shape \(3,\) but "
                                         r"layer 'attn''s query \['wq'\] of shape \(3, 4\) has "
                                         r"2 heads"):
        call(logits={"attn": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"layer 'attn''s key path 'w_k' is not in the "
                                         r"params, whose paths are \['wk'\], \['wq'\]"):
        call(spec={"attn": QKClipLayer("wq", "w_k", num_heads=2)})
    with pytest.raises(ValueError, match=r"axis 1 \(4\) does not split into num_heads=3"):
        call(spec={"attn": QKClipLayer("wq", "wk", num_heads=3)})
    with pytest.raises(ValueError, match="has no head_axis 2"):
        call(spec={"attn": QKClipLayer("wq", "wk", head_axis=2)})
    with pytest.raises(ValueError, match=r"\['wq'\] is also layer 'attn''s query"):
        call(spec={"attn": QKClipLayer("wq", "wk"), "b": QKClipLayer("wq", "wk")},
             logits={"attn": jnp.ones(4), "b": jnp.ones(4)})
    with pytest.raises(ValueError, match=r"shape \(2,\) but .* has 4 heads in 3 stacked"):
        call(spec={"attn": QKClipLayer("wq", "wk", layer_axis=0)})
    # An empty spec is a no-op, params or not.
    u, _ = qk_clip(layers={}).update(params, state, None, attention_logits={})
    assert u is params
