"""Greedy tokens inside the LM head (greedy.py's packed argmax slots), and the decode step's
embedding that reads them: vs torch.argmax and torch indexing."""

import pytest
import torch

from flint_kernels import greedy
from flint_kernels.dense_gemv import dense_gemv, rms_norm_dense_gemv, rms_norm_dense_gemv_torch
from flint_kernels.embedding import decode_embedding, decode_embedding_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def empty_slots(n):
    return torch.full((n,), greedy.EMPTY, dtype=torch.int64, device=DEVICE)


def test_packing_orders_as_argmax_with_the_first_of_equal_values():
    logits = torch.tensor([[-3.0, -1.0, -1.0, -2.0],           # negatives: the first -1
                           [0.5, 2.0, float("-inf"), 2.0],     # a tie: row 1, not 3
                           [-float("inf"), -1e30, -1e-30, -0.5],
                           [1e-30, 7.0, 1e30, 1e30]])
    packed = greedy.pack_argmax(logits)
    assert greedy.token(packed).tolist() == [1, 1, 2, 2] == logits.argmax(-1).tolist()
    # the packed values (all of row 0 here) order as the logits they hold
    keys = torch.stack([greedy.pack_argmax(v.view(1, 1))[0] for v in logits.flatten()])
    assert torch.equal(torch.argsort(keys, stable=True), torch.argsort(logits.flatten(), stable=True))
    ids = torch.tensor([0, 5, 151551, 2**31])
    assert torch.equal(greedy.token(greedy.pack_token(ids)), ids)


@pytest.mark.parametrize("t,n", [(1, 1000), (3, 517), (4, 64)])
def test_lm_head_slots_hold_the_argmax_of_its_logits(t, n):
    g = torch.Generator().manual_seed(t * n)
    k = 256
    x = torch.randn(t, k, generator=g).to(torch.bfloat16).to(DEVICE)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16)
    w[n - 3] = w[7] = w[n // 2] = 0.2 * x[0].cpu()  # equal rows in three programs: equal top logits for token 0
    w = w.to(DEVICE)
    slots = empty_slots(t)
    logits = dense_gemv(x, w, out_dtype=torch.float32, greedy=slots)
    assert logits.dtype == torch.float32
    assert greedy.token(slots).tolist() == logits.argmax(-1).tolist()
    assert greedy.token(slots)[0].item() == 7  # the first of the tied rows
    assert torch.equal(slots, greedy.pack_argmax(logits))


@pytest.mark.parametrize("residual", [False, True])
def test_final_norm_lm_head_and_argmax_in_one_launch(residual):
    g = torch.Generator().manual_seed(3)
    t, k, n = 2, 384, 700
    x = torch.randn(t, k, generator=g).to(torch.bfloat16).to(DEVICE)
    res = torch.randn(t, k, generator=g).to(torch.bfloat16).to(DEVICE) if residual else None
    norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(torch.bfloat16).to(DEVICE)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16).to(DEVICE)
    slots, torch_slots = empty_slots(t), empty_slots(t)
    got, got_res = rms_norm_dense_gemv(x, res, norm_w, 1e-6, w, out_dtype=torch.float32, greedy=slots)
    exp, exp_res = rms_norm_dense_gemv_torch(x, res, norm_w, 1e-6, w, out_dtype=torch.float32, greedy=torch_slots)
    assert got.dtype == exp.dtype == torch.float32
    torch.testing.assert_close(got, exp, rtol=2e-2, atol=2e-2)  # bf16 roundings of the norm and the dot
    torch.testing.assert_close(got_res, exp_res)  # residual + x in bf16 (the interpreter truncates: 1 ulp)
    assert greedy.token(slots).tolist() == got.argmax(-1).tolist()
    assert torch.equal(torch_slots, greedy.pack_argmax(exp))


def test_greedy_slots_are_checked():
    x = torch.randn(2, 128, device=DEVICE)
    w = torch.randn(10, 128, device=DEVICE)
    with pytest.raises(ValueError, match=r"greedy is torch.int32 \(2,\).*expected int64 \[2\]"):
        dense_gemv(x, w, out_dtype=torch.float32, greedy=torch.zeros(2, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("embed", [decode_embedding, decode_embedding_torch])
def test_decode_embedding_takes_the_previous_steps_tokens_and_clears_this_steps(embed):
    g = torch.Generator().manual_seed(5)
    v, h = 300, 1100
    weight = torch.randn(v, h, generator=g).to(DEVICE, torch.bfloat16)
    ids = torch.tensor([4, 0, 9, 0], device=DEVICE)
    prev_rows = torch.tensor([-1, 2, -1, 0], device=DEVICE)  # rows 1 and 3 take tokens of the step before
    prev = torch.cat([greedy.pack_argmax(torch.randn(1, v, generator=g)),  # slot 0: a greedy pick
                      greedy.pack_token(torch.tensor([17, 299, 3]))]).to(DEVICE)  # sampled tokens
    clear = torch.arange(4, device=DEVICE)
    got = embed(weight, ids, prev_rows, prev, clear)
    expected_ids = torch.stack([ids[0], torch.tensor(299, device=DEVICE), ids[2], greedy.token(prev[:1])[0]])
    assert torch.equal(got, weight[expected_ids])
    assert clear.tolist() == [greedy.EMPTY] * 4
    with pytest.raises(ValueError, match="prev and clear are the same slots"):
        embed(weight, ids, prev_rows, clear, clear)
    with pytest.raises(ValueError, match=r"prev_rows is torch.int32 \(4,\)"):
        embed(weight, ids, prev_rows.int(), prev, clear)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4])
def test_real_lm_head(t):
    """flint-40b's 150144 x 2048 head with the final norm folded: every token's slot is the argmax
    of the logits the launch stored, and those match the unfused torch head."""
    g = torch.Generator().manual_seed(t)
    v, k = 150144, 2048
    x = torch.randn(t, k, generator=g).to(torch.bfloat16).to(DEVICE)
    res = torch.randn(t, k, generator=g).to(torch.bfloat16).to(DEVICE)
    norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(torch.bfloat16).to(DEVICE)
    w = (torch.randn(v, k, device=DEVICE) * k ** -0.5).to(torch.bfloat16)
    w[v - 1] = w[5]  # a tie across the first and the last program: row 5 wins where it is the best
    slots = empty_slots(t)
    got, _ = rms_norm_dense_gemv(x, res, norm_w, 1e-6, w, out_dtype=torch.float32, greedy=slots)
    exp, _ = rms_norm_dense_gemv_torch(x, res, norm_w, 1e-6, w, out_dtype=torch.float32)
    torch.testing.assert_close(got, exp, rtol=2e-2, atol=2e-2)
    assert torch.equal(slots, greedy.pack_argmax(got))
