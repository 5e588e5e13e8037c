"""The reference model against independent computations (never the same code twice)."""

import math

import pytest
import torch

from flint_backend.config import FULL, SLIDING, FlintConfig
from flint_backend.reference import build_reference
from flint_backend.weights.random_init import random_weights


def tiny_model(seed=0, **overrides):
    config = FlintConfig.preset("flint-tiny", **overrides)
    return config, build_reference(config, dict(random_weights(config, seed)), dtype=torch.float64)


def explicit_attention(attn, x, window):
    """Loop over queries; each attends over an explicitly listed set of keys (float64)."""
    c = attn.config
    t, d = x.shape[0], c.head_dim
    group = c.num_attention_heads // c.num_key_value_heads

    def norm(v, w):
        return v / torch.sqrt((v * v).mean() + c.rms_norm_eps) * w

    def rope(v, pos):
        half = d // 2
        out = torch.empty_like(v)
        for k in range(half):
            angle = pos * c.rope_theta ** (-2 * k / d)
            out[k] = v[k] * math.cos(angle) - v[k + half] * math.sin(angle)
            out[k + half] = v[k + half] * math.cos(angle) + v[k] * math.sin(angle)
        return out

    q = (x @ attn.q_proj.weight.T).view(t, -1, d)
    k = (x @ attn.k_proj.weight.T).view(t, -1, d)
    v = (x @ attn.v_proj.weight.T).view(t, -1, d)
    heads = torch.zeros(t, c.num_attention_heads, d, dtype=x.dtype)
    for i in range(t):
        keys = range(max(0, i - window + 1), i + 1) if window else range(i + 1)
        for h in range(c.num_attention_heads):
            kv = h // group
            qi = norm(q[i, h], attn.q_norm.weight)
            if window:
                qi = rope(qi, i)
            logits = []
            for j in keys:
                kj = norm(k[j, kv], attn.k_norm.weight)
                if window:
                    kj = rope(kj, j)
                logits.append(float(qi @ kj) / math.sqrt(d))
            sink = float(attn.sinks[h])
            top = max(logits + [sink])
            exps = [math.exp(s - top) for s in logits]
            denom = sum(exps) + math.exp(sink - top)
            heads[i, h] = sum(e / denom * v[j, kv] for e, j in zip(exps, keys))
    return heads.reshape(t, -1) @ attn.o_proj.weight.T


@pytest.mark.parametrize("layer", [0, 3])  # a sliding (RoPE) and a full (NoPE) layer
def test_attention_matches_explicit_loops(layer):
    config, model = tiny_model()
    attn = model.model.layers[layer].self_attn
    x = torch.randn(23, config.hidden_size, dtype=torch.float64)  # crosses the window of 9 twice
    window = config.sliding_window if config.layer_types[layer] == SLIDING else None
    torch.testing.assert_close(attn(x[None])[0], explicit_attention(attn, x, window), rtol=1e-9, atol=1e-9)


def test_sliding_window_sees_only_the_last_window_positions():
    # RoPE scores depend on relative positions only, so a sliding-window query's output must
    # equal the last output of the same layer run on just its window (positions from 0).
    config, model = tiny_model()
    attn, w = model.model.layers[0].self_attn, config.sliding_window
    x = torch.randn(1, 30, config.hidden_size, dtype=torch.float64)
    full = attn(x)[0]
    for i in (w - 1, w, w + 1, 29):
        alone = attn(x[:, i - w + 1:i + 1])[0, -1] if i >= w - 1 else None
        torch.testing.assert_close(full[i], alone, rtol=1e-9, atol=1e-9)
    x2 = x.clone()
    x2[:, 30 - w - 1] += 5.0  # a token just outside the last query's window
    torch.testing.assert_close(attn(x2)[0, -1], full[-1], rtol=0, atol=0)


def test_huge_sink_silences_attention():
    config, model = tiny_model()
    attn = model.model.layers[0].self_attn
    x = torch.randn(1, 12, config.hidden_size, dtype=torch.float64)
    assert attn(x).abs().max() > 1e-2
    attn.sinks.data.fill_(1e4)
    assert attn(x).abs().max() < 1e-12


def test_one_huge_sink_silences_only_its_head():
    config, model = tiny_model()
    attn = model.model.layers[3].self_attn
    x = torch.randn(1, 12, config.hidden_size, dtype=torch.float64)
    captured = {}
    attn.o_proj.register_forward_hook(lambda m, inp, out: captured.update(heads=inp[0]))
    attn.sinks.data[2] = 1e4
    attn(x)
    heads = captured["heads"].view(12, config.num_attention_heads, config.head_dim)
    assert heads[:, 2].abs().max() < 1e-12
    assert heads[:, 1].abs().max() > 1e-3


def test_causality():
    config, model = tiny_model()
    ids = torch.randint(0, config.vocab_size, (2, 25))
    logits = model(ids).logits
    torch.testing.assert_close(model(ids[:, :11]).logits, logits[:, :11], rtol=1e-10, atol=1e-10)
    ids2 = ids.clone()
    ids2[:, 11] = (ids[:, 11] + 1) % config.vocab_size
    assert not torch.allclose(model(ids2).logits[:, 11], logits[:, 11])


def test_full_layers_are_position_free_sliding_layers_are_not():
    # The last query sees every earlier token in both layers (window widened past T).
    # Permuting the earlier tokens changes nothing under NoPE and changes the output under RoPE.
    config, model = tiny_model(sliding_window=64)
    x = torch.randn(1, 16, config.hidden_size, dtype=torch.float64)
    perm = torch.cat([torch.randperm(15), torch.tensor([15])])
    full, sliding = model.model.layers[3].self_attn, model.model.layers[0].self_attn
    assert config.layer_types[3] == FULL and config.layer_types[0] == SLIDING
    torch.testing.assert_close(full(x[:, perm])[0, -1], full(x)[0, -1], rtol=1e-10, atol=1e-10)
    assert (sliding(x[:, perm])[0, -1] - sliding(x)[0, -1]).abs().max() > 1e-3


def test_router_bias_selects_but_does_not_weigh():
    config, model = tiny_model()
    router = model.model.layers[2].mlp.gate
    x = torch.randn(40, config.hidden_size, dtype=torch.float64)
    scores = torch.sigmoid(x @ router.weight.T)
    ids_before, _ = router(x)

    router.e_score_correction_bias.data.zero_()
    router.e_score_correction_bias.data[[5, 11]] = 10.0  # forces experts 5 and 11 into every top-k
    ids, weights = router(x)
    assert ((ids == 5).any(-1) & (ids == 11).any(-1)).all()
    assert not torch.equal(ids.sort(-1).values, ids_before.sort(-1).values)
    chosen = scores.gather(-1, ids)  # the weights come from the unbiased scores
    expected = chosen / chosen.sum(-1, keepdim=True) * config.routed_scaling_factor
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(weights.sum(-1), torch.full((40,), config.routed_scaling_factor, dtype=torch.float64))
    # without the bias the choice is the plain top-k of the scores
    router.e_score_correction_bias.data.zero_()
    torch.testing.assert_close(router(x)[0].sort(-1).values, scores.topk(config.num_experts_per_tok).indices.sort(-1).values)


def test_moe_equals_per_token_sum_of_chosen_experts():
    config, model = tiny_model()
    moe = model.model.layers[4].mlp
    x = torch.randn(7, config.hidden_size, dtype=torch.float64)
    ids, weights = moe.gate(x)
    out = moe(x)
    for t in range(7):
        expected = moe.shared_experts(x[t])
        for k in range(config.num_experts_per_tok):
            e = moe.experts[int(ids[t, k])]
            expected = expected + weights[t, k] * e.down_proj(torch.nn.functional.silu(e.gate_proj(x[t])) * e.up_proj(x[t]))
        torch.testing.assert_close(out[t], expected)


# ------------------------------------------------------------------ hand-computed micro model
MICRO = dict(vocab_size=2, hidden_size=2, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
             head_dim=2, intermediate_size=1, moe_intermediate_size=1, n_routed_experts=2,
             num_experts_per_tok=1, first_k_dense_replace=1, layer_types=[SLIDING, FULL],
             sliding_window=2, rope_theta=1.0, rms_norm_eps=1e-30, routed_scaling_factor=3.0)


def test_hand_computed_two_layer_example():
    """Two tokens through a 2-layer model whose every number is worked out below by hand."""
    config = FlintConfig(**MICRO)
    model = build_reference(config, dtype=torch.float64)
    sd = model.state_dict()
    eye = torch.eye(2, dtype=torch.float64)
    for name in sd:
        if name.endswith("norm.weight"):
            sd[name] = torch.ones_like(sd[name])
    sd["model.embed_tokens.weight"] = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    for i in (0, 1):
        p = f"model.layers.{i}.self_attn."
        sd[p + "q_proj.weight"], sd[p + "k_proj.weight"], sd[p + "v_proj.weight"] = eye, eye, eye
        sd[p + "o_proj.weight"] = eye
        sd[p + "sinks"] = torch.tensor([0.0])
    # layer 0 dense MLP: h = silu(x0) * x1 written to dim 0
    sd["model.layers.0.mlp.gate_proj.weight"] = torch.tensor([[1.0, 0.0]])
    sd["model.layers.0.mlp.up_proj.weight"] = torch.tensor([[0.0, 1.0]])
    sd["model.layers.0.mlp.down_proj.weight"] = torch.tensor([[1.0], [0.0]])
    # layer 1 MoE: expert weights zero except one path, so only routing weights matter
    p = "model.layers.1.mlp."
    sd[p + "gate.weight"] = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    sd[p + "gate.e_score_correction_bias"] = torch.tensor([0.0, 0.0])
    for e in (0, 1):
        sd[p + f"experts.{e}.gate_proj.weight"] = torch.tensor([[1.0, 0.0]])
        sd[p + f"experts.{e}.up_proj.weight"] = torch.tensor([[1.0, 0.0]])
        sd[p + f"experts.{e}.down_proj.weight"] = torch.tensor([[0.0], [1.0 + e]])
    for proj in ("gate_proj", "up_proj", "down_proj"):
        sd[p + f"shared_experts.{proj}.weight"] = torch.zeros_like(sd[p + f"shared_experts.{proj}.weight"])
    sd["lm_head.weight"] = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    model.load_state_dict(sd)

    s2 = math.sqrt(2.0)
    silu = lambda z: z / (1 + math.exp(-z))
    sig = lambda z: 1 / (1 + math.exp(-z))
    # tokens [0, 1]: x = [[3, 4], [1, 0]]
    # layer 0 attention (sliding, RoPE theta=1, D=2: angle = position):
    #   q = k = v = rmsnorm(x) ; rmsnorm([3,4]) = [3,4]/sqrt(12.5) = [0.6*s2, 0.8*s2]; rmsnorm([1,0]) = [s2, 0]
    #   RMSNorm of q/k per head is idempotent here (already unit RMS)
    #   token 0 attends itself + sink(0): score_00 = |q0|^2/sqrt2 = 2/s2 = s2 (RoPE rotates q0,k0 by 0)
    #     out0 = e^s2/(e^s2+1) * v0
    n0, n1 = [0.6 * s2, 0.8 * s2], [s2, 0.0]
    a00 = math.exp(s2) / (math.exp(s2) + 1)
    out0 = [a00 * n0[0], a00 * n0[1]]
    #   token 1: q1 rotated by 1 rad, k0 by 0, k1 by 1: score_10 = (R1 n1).n0/s2, score_11 = |n1|^2/s2 = s2
    q1 = [s2 * math.cos(1.0), s2 * math.sin(1.0)]
    s10 = (q1[0] * n0[0] + q1[1] * n0[1]) / s2
    s11 = s2
    den = math.exp(s10) + math.exp(s11) + 1.0
    out1 = [(math.exp(s10) * n0[j] + math.exp(s11) * n1[j]) / den for j in range(2)]
    h = [[3 + out0[0], 4 + out0[1]], [1 + out1[0], 0 + out1[1]]]

    def rms(v):
        r = math.sqrt((v[0] ** 2 + v[1] ** 2) / 2)
        return [v[0] / r, v[1] / r]

    # layer 0 dense MLP on rmsnorm(h): adds silu(n[0]) * n[1] to dim 0
    for t in range(2):
        n = rms(h[t])
        h[t][0] += silu(n[0]) * n[1]
    # layer 1 attention (full, NoPE): q = k = v = rmsnorm(h)
    m = [rms(h[0]), rms(h[1])]
    dot = lambda a, b: a[0] * b[0] + a[1] * b[1]
    o0 = [math.exp(dot(m[0], m[0]) / s2) / (math.exp(dot(m[0], m[0]) / s2) + 1) * m[0][j] for j in range(2)]
    e10, e11 = math.exp(dot(m[1], m[0]) / s2), math.exp(dot(m[1], m[1]) / s2)
    o1 = [(e10 * m[0][j] + e11 * m[1][j]) / (e10 + e11 + 1) for j in range(2)]
    h = [[h[0][j] + o0[j] for j in range(2)], [h[1][j] + o1[j] for j in range(2)]]
    # layer 1 MoE, top-1 of sigmoid(n) (identity router): weight = score/score * 3 = 3;
    # expert e adds (1+e) * silu(n0) * n0 to dim 1
    for t in range(2):
        n = rms(h[t])
        e = 0 if sig(n[0]) >= sig(n[1]) else 1
        h[t][1] += 3.0 * (1 + e) * silu(n[0]) * n[0]
    expected = torch.tensor([rms(h[0]), rms(h[1])], dtype=torch.float64)  # final norm, identity LM head
    torch.testing.assert_close(model(torch.tensor([0, 1])).logits, expected, rtol=1e-12, atol=1e-12)
