"""fused_moe, both kernel paths (small-batch GEMVs, grouped GEMM), dense and NVFP4 experts, vs
fused_moe_torch; and the torch twin (and the kernels) vs transformers' FlintSparseMoeBlock."""

import pytest
import torch
import transformers
from transformers.models.flint import modeling_flint as hf

from flint_backend.config import FlintConfig
from flint_backend.weights.nvfp4 import concat_rows
from flint_backend.weights.nvfp4_quantize import quantize_nvfp4
from flint_kernels import moe_gemv, moe_grouped, moe_sort, split_k, tuning
from flint_kernels.moe import fused_moe, fused_moe_torch
from flint_kernels.moe_sort import sort_pairs, sort_pairs_torch
from kv_cases import assert_scaled_close
from launch_spy import spy_launches

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 x (dense fp32 or NVFP4 weights): accumulation order only. bf16 x: gate, up, silu, the
# product, every expert output and the combine are rounded to bf16 at moe.py's points (exactly
# there: test_bf16_rounding_points_are_moes). Triton's interpreter truncates those casts where
# the GPU rounds to nearest, a bias that reaches ~3% of the output scale on the CPU.
FP32_TOL = dict(rtol=1e-4, atol=1e-5)
BF16_REL = 4e-2
PATHS = ["small", "grouped"]


def experts(e, h, i, i_s, dtype, fmt, seed=0):
    """(w13, w2, shared_w13, shared_w2); fmt: dense, nvfp4, or mixed (NVFP4 gate/up, dense down,
    as a checkpoint stores down projections whose K is not a multiple of 64)."""
    g = torch.Generator().manual_seed(seed)
    gate, up = (torch.randn(2, e, i, h, generator=g) / h ** 0.5).unbind(0)
    down = torch.randn(e, h, i, generator=g) / i ** 0.5
    s_gate, s_up = (torch.randn(2, i_s, h, generator=g) / h ** 0.5).unbind(0)
    s_down = torch.randn(h, i_s, generator=g) / i_s ** 0.5
    if fmt == "dense":
        ws = torch.cat([gate, up], 1), down, torch.cat([s_gate, s_up], 0), s_down
        return [w.to(DEVICE, dtype) for w in ws]
    q = quantize_nvfp4
    w13, s13 = concat_rows([q(gate), q(up)]), concat_rows([q(s_gate), q(s_up)])
    w2, s2 = (q(down), q(s_down)) if fmt == "nvfp4" else (down.to(dtype), s_down.to(dtype))
    return [w.to(DEVICE) for w in (w13, w2, s13, s2)]


def routing(t, e, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    return ids.to(DEVICE), torch.rand(t, k, generator=g).to(DEVICE) + 0.1


def check(got, expected, dtype):
    assert got.dtype == dtype and got.shape == expected.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, **FP32_TOL)
    else:
        assert_scaled_close(got, expected, rel=BF16_REL)


@pytest.mark.parametrize("path", ["small", "grouped"], ids=["small-one-load-down", "grouped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,e,k", [(1, 16, 4), (3, 16, 4), (5, 8, 8), (17, 16, 4)],
                         ids=["T1", "T3", "T5-all-experts", "T17"])
def test_dense_experts(path, t, e, k, dtype):
    """The small-batch path's dense down launch takes all slots in one load (up to 8 slots, so
    K = 8 plus the shared expert takes the per-expert loop)."""
    w13, w2, s13, s2 = experts(e, 64, 32, 32, dtype, "dense", seed=t)
    ids, weights = routing(t, e, k, seed=t)
    x = torch.randn(t, 64, device=DEVICE).to(dtype)
    check(fused_moe(x, ids, weights, w13, w2, s13, s2, path=path),
          fused_moe_torch(x, ids, weights, w13, w2, s13, s2), dtype)


@pytest.fixture(params=[False, True], ids=["bytes", "words"])
def words(request, monkeypatch):
    """Both NVFP4 decodes of the small-batch path's launches (tuning.FP4_MOE_WORDS, FP4_MOE_DOWN_WORDS)."""
    monkeypatch.setattr(tuning, "FP4_MOE_WORDS", request.param)
    monkeypatch.setattr(tuning, "FP4_MOE_DOWN_WORDS", request.param)
    return request.param


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt,dtype", [("nvfp4", torch.float32), ("mixed", torch.float32),
                                       ("nvfp4", torch.bfloat16)])
def test_nvfp4_experts(path, fmt, dtype, words):
    if path == "grouped" and words:
        pytest.skip("the NVFP4 decode is the small-batch path's")
    t, e, k = 3, 8, 3
    w13, w2, s13, s2 = experts(e, 64, 64, 64, dtype, fmt, seed=1)
    ids, weights = routing(t, e, k, seed=1)
    x = torch.randn(t, 64, device=DEVICE).to(dtype)
    check(fused_moe(x, ids, weights, w13, w2, s13, s2, path=path),
          fused_moe_torch(x, ids, weights, w13, w2, s13, s2), dtype)


@pytest.mark.parametrize("fmt,dtype", [("nvfp4", torch.bfloat16), ("nvfp4", torch.float32), ("mixed", torch.bfloat16),
                                       ("dense", torch.bfloat16)],
                         ids=["halves", "nvfp4-fp32", "mixed", "dense"])
@pytest.mark.parametrize("t,k", [(3, 3), (17, 4)], ids=["few", "experts-past-8-tokens"])
@pytest.mark.parametrize("block_m", [8, 16], ids=["transposed", "upright"])
def test_grouped_tiles_and_the_halves_layout(fmt, dtype, t, k, block_m, monkeypatch):
    """Blocks of 8 tokens computed transposed (weight rows on the MMA's M side) or of 16 as usual;
    transposed NVFP4 in fp16 tiles with bf16 x: activations in the halves layout (every weight
    NVFP4, K a multiple of the K step), else the usual layout. A shared expert twice as wide; 17 tokens over
    8 experts give experts more than one block."""
    tiles = (128, 128, 128, 2, 3) if DEVICE == "cuda" else (32, 32, 32, 4, 1)
    monkeypatch.setattr(tuning, "MOE_GROUPED_TILES", (block_m, *tiles))
    e, h, i = 8, 128, 64
    w13, w2, s13, s2 = experts(e, h, i, 2 * i, dtype, fmt, seed=3)
    ids, weights = routing(t, e, k, seed=3)
    x = torch.randn(t, h, device=DEVICE).to(dtype)
    check(fused_moe(x, ids, weights, w13, w2, s13, s2, path="grouped"),
          fused_moe_torch(x, ids, weights, w13, w2, s13, s2), dtype)


def test_grouped_tiles_cap_registers_a_thread(monkeypatch):
    """A seventh entry of tuning.MOE_GROUPED_TILES is ptxas's .maxnreg for both expert launches
    (programs an SM by registers; the interpreter ignores it): the outputs stay moe.py's."""
    tiles = (128, 128, 128, 4, 3) if DEVICE == "cuda" else (32, 32, 32, 4, 1)
    monkeypatch.setattr(tuning, "MOE_GROUPED_TILES", (8, *tiles, 64))
    launches = spy_launches(monkeypatch, moe_grouped, "_moe_grouped_kernel", "GATE_UP", "maxnreg")
    e, h, i = 8, 128, 64
    w13, w2, s13, s2 = experts(e, h, i, 2 * i, torch.bfloat16, "nvfp4", seed=4)
    ids, weights = routing(5, e, 3, seed=4)
    x = torch.randn(5, h, device=DEVICE).to(torch.bfloat16)
    check(fused_moe(x, ids, weights, w13, w2, s13, s2, path="grouped"),
          fused_moe_torch(x, ids, weights, w13, w2, s13, s2), torch.bfloat16)
    assert [launch[1:] for launch in launches] == [(True, 64), (False, 64)]


@pytest.mark.parametrize("handoff,unsorted", [(True, False), (True, True), (False, False)],
                         ids=["handoff", "handoff-unsorted", "whole-launch"])
@pytest.mark.parametrize("t,one_expert", [(17, False), (17, True), (3, False)],
                         ids=["experts-past-8-tokens", "one-expert-for-all", "few"])
def test_down_takes_each_block_from_gate_up_by_a_counter(handoff, unsorted, t, one_expert, monkeypatch):
    """Transposed decode tiles with tuning.MOE_HANDOFF: gate/up counts each block's stored column
    tiles (a routed expert's, or the twice as wide shared expert's), which is the count down
    polls for; both grids run column tiles first; every counter is zero again after the call,
    so a second call (a graph replay) computes the same bits. Without it, the usual grids.
    UNSORTED (tuning.MOE_UNSORTED_MAX_TOKENS): no sort launch; the blocks are
    blocks_from_ids_torch's (gate/up stores each block's pairs), with experts of no pairs, of
    more than 8 (further blocks) and of every token."""
    monkeypatch.setattr(tuning, "MOE_HANDOFF", handoff)
    monkeypatch.setattr(tuning, "MOE_UNSORTED_MAX_TOKENS", 64 if unsorted else None)
    tiles = (128, 128, 128, 2, 3) if DEVICE == "cuda" else (32, 32, 32, 4, 1)
    monkeypatch.setattr(tuning, "MOE_GROUPED_TILES", (8, *tiles))
    kernel, launches = moe_grouped._moe_grouped_kernel, []
    sorts = spy_launches(monkeypatch, moe_sort, "_moe_sort_kernel")

    class AfterLaunch:  # each launch's grid, flags, and the block table and counters as it left them
        def __getitem__(self, grid):
            def run(**kw):
                kernel[grid](**kw)
                blocks = grid[1] if kw["HANDOFF"] else grid[0]
                launches.append((grid, kw["HANDOFF"], kw["GATE_UP"], kw["block_expert_ptr"][:blocks].clone(),
                                 kw["sorted_pairs_ptr"].clone(), kw["ready_ptr"][:blocks].clone(), kw))
            return run

    monkeypatch.setattr(moe_grouped, "_moe_grouped_kernel", AfterLaunch())
    e, h, k = 8, 128, 4
    i = 2 * tiles[0]  # two column tiles a routed expert, four the shared one
    w13, w2, s13, s2 = experts(e, h, i, 2 * i, torch.bfloat16, "nvfp4", seed=4)
    ids, weights = routing(t, e, k, seed=4)
    if one_expert:  # expert 5 has every token (3 blocks), the others 2-3 tokens' worth each
        others = [0, 1, 2, 3, 4, 6, 7]
        ids = torch.tensor([[5] + [others[(n + j) % 7] for j in range(k - 1)] for n in range(t)],
                           dtype=torch.int32, device=DEVICE)
    x = torch.randn(t, h, device=DEVICE).to(torch.bfloat16)
    got = fused_moe(x, ids, weights, w13, w2, s13, s2, path="grouped")
    assert not split_k.arrival_counters(1, x.device).any()
    assert torch.equal(fused_moe(x, ids, weights, w13, w2, s13, s2, path="grouped"), got)
    check(got, fused_moe_torch(x, ids, weights, w13, w2, s13, s2), torch.bfloat16)
    assert len(sorts) == (0 if unsorted else 2)
    (grid13, flag13, gate_up, block_expert, sorted_pairs, ready, kw), (grid2, flag2, *_) = launches[:2]
    assert gate_up and flag13 is handoff and flag2 is handoff and kw["UNSORTED"] is unsorted
    if unsorted:
        block_expert, pairs = moe_grouped.blocks_from_ids_torch(ids, e, True, 8)
        used = (block_expert <= e).repeat_interleave(8).to(DEVICE)
        assert torch.equal(sorted_pairs[used], pairs.to(DEVICE)[used])  # stored by gate/up, read by down
        if one_expert:
            assert (block_expert == 5).sum() == 3 and block_expert[3 + 5] == 5
    blocks = block_expert.numel()
    assert (grid13[1], grid2[1]) == (blocks, blocks) if handoff else (grid13[0], grid2[0]) == (blocks, blocks)
    if handoff:  # column tiles: 4 (the shared expert's); down's H / BLOCK_N
        assert (grid13[0], grid2[0]) == (4, h // tiles[1])
    if handoff:
        wanted = torch.where(block_expert == e, kw["tiles_shared"], kw["tiles_routed"]).to(DEVICE)
        assert (kw["tiles_routed"], kw["tiles_shared"]) == (2, 4)
        assert torch.equal(ready, torch.where(block_expert.to(DEVICE) <= e, wanted, 0).to(ready.dtype))


def test_blocks_from_ids_torch():
    """The UNSORTED block table by hand: 2 tokens, shared expert, blocks of 2 pairs; expert 1 has
    three pairs (a further block), expert 0 one, expert 2 none."""
    ids = torch.tensor([[1, 0], [1, 1]], dtype=torch.int32)  # pairs (slots 3): 0 -> e1, 1 -> e0, 3 -> e1, 4 -> e1
    block_expert, pairs = moe_grouped.blocks_from_ids_torch(ids, 3, True, 2)
    # blocks: shared (1), experts 0..2 (3), further (2 * 2 // 2 = 2)
    assert block_expert.tolist() == [3, 0, 1, 4, 1, 4]
    assert pairs.tolist() == [2, 5, 1, 6, 0, 3, 6, 6, 4, 6, 6, 6]


@pytest.mark.parametrize("h", [64, 512], ids=["H-one-step", "H-two-steps"])
def test_nvfp4_gate_up_launches_with_a_shared_expert(h, monkeypatch):
    """NVFP4 words with a shared expert (one or two steps of H): a single gate/up launch over
    every slot."""
    monkeypatch.setattr(tuning, "FP4_MOE_WORDS", True)
    t, e, k = 2, 8, 3
    w13, w2, s13, s2 = experts(e, h, 32, 64, torch.float32, "nvfp4", seed=8)
    ids, weights = routing(t, e, k, seed=8)
    x = torch.randn(t, h, device=DEVICE)
    check(fused_moe(x, ids, weights, w13, w2, s13, s2, path="small"),
          fused_moe_torch(x, ids, weights, w13, w2, s13, s2), torch.float32)


@pytest.mark.parametrize("shared", ["none", "same", "wider"])
@pytest.mark.parametrize("k", [2, 7])
def test_nvfp4_small_batch_slot_layouts(shared, k, words, monkeypatch):
    """The small-batch NVFP4 launches' layouts: gate/up programs of 8 rows (4 or 8 blocks an
    expert), and the down launch with all of a token's experts in one tile of 8 slots
    (tuning.FP4_MOE_DOWN_WORDS): no shared expert, one of the routed experts' width, a wider one; K
    filling 7 of the 8 slots; 5 tokens."""
    monkeypatch.setattr(tuning, "MOE_GATE_UP_ROWS", 8)
    t, e = 5, 16
    w13, w2, s13, s2 = experts(e, 64, 32, 64 if shared == "wider" else 32, torch.float32, "nvfp4", seed=7)
    if shared == "none":
        s13 = s2 = None
    ids, weights = routing(t, e, k, seed=7)
    x = torch.randn(t, 64, device=DEVICE)
    check(fused_moe(x, ids, weights, w13, w2, s13, s2, path="small"),
          fused_moe_torch(x, ids, weights, w13, w2, s13, s2), torch.float32)


def small_case(shared, h, dtype, seed):
    """3 tokens, top-3 of 8 NVFP4 experts of width 32 and H `h`; shared: "none", "same" (a shared
    expert as wide) or "wider" (64): -> x, ids, weights, (w13, w2, s13, s2)."""
    t, e, k = 3, 8, 3
    w13, w2, s13, s2 = experts(e, h, 32, 64 if shared == "wider" else 32, dtype, "nvfp4", seed=seed)
    if shared == "none":
        s13 = s2 = None
    ids, weights = routing(t, e, k, seed=seed)
    return torch.randn(t, h, device=DEVICE).to(dtype), ids, weights, (w13, w2, s13, s2)


@pytest.mark.parametrize("rows", [8, 16])
def test_down_words_rows_a_program(rows, monkeypatch):
    """The NVFP4 word down launch with 8 (the GPU's default) or 16 output rows a program, a wider
    shared expert: close to fused_moe_torch."""
    monkeypatch.setattr(tuning, "FP4_MOE_WORDS", True)
    monkeypatch.setattr(tuning, "FP4_MOE_DOWN_WORDS", True)
    monkeypatch.setattr(moe_gemv, "DOWN_WORDS_ROWS", rows)
    x, ids, weights, ws = small_case("wider", 64, torch.bfloat16, seed=17)
    check(fused_moe(x, ids, weights, *ws, path="small"), fused_moe_torch(x, ids, weights, *ws), torch.bfloat16)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt,dtype,t", [("dense", torch.float32, 6), ("nvfp4", torch.bfloat16, 19)],
                         ids=["dense", "nvfp4-bf16-two-blocks"])
def test_one_expert_for_every_token_and_no_shared_expert(path, fmt, dtype, t):
    """Expert 5 takes every token (19: more than one 16-row block of the grouped path, whose bf16
    NVFP4 tiles decode to fp16: tuning.FP4_MMA_F16), most others none."""
    e, k = 16, 2
    w13, w2, _, _ = experts(e, 64, 32, 32, dtype, fmt, seed=2)
    ids, weights = routing(t, e, k, seed=2)
    ids[:, 0] = 5
    ids[:, 1] = torch.where(ids[:, 1] == 5, 6, ids[:, 1])
    x = torch.randn(t, 64, device=DEVICE).to(dtype)
    check(fused_moe(x, ids, weights, w13, w2, path=path), fused_moe_torch(x, ids, weights, w13, w2), dtype)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt,dtype", [("dense", torch.float32), ("dense", torch.bfloat16), ("nvfp4", torch.bfloat16),
                                       ("nvfp4", torch.float32)])
@pytest.mark.parametrize("t,k,wide", [(1, 6, 2), (3, 2, 2), (5, 6, 2), (17, 6, 2), (3, 7, 2), (5, 4, 4)],
                         ids=["T1-2I", "T3-2I", "T5-2I", "T17-2I", "T3-K7-2I-one-slot", "T5-4I"])
def test_shared_expert_wider_than_the_routed_ones(path, fmt, dtype, t, k, wide, words):
    """flint-40b's shared expert is 2I wide (1024 against 512), added in full: the small-batch
    launches take it as 2I / I slots of I rows beside the K routed ones (moe_gemv.shared_chunks),
    or as one slot of 2I rows where K + 2 exceeds the 8 slots (K = 7); 4I as four slots."""
    if words and (path, fmt) != ("small", "nvfp4"):
        pytest.skip("the NVFP4 decode is the small-batch path's NVFP4 decode")
    e, i = 8, 32
    w13, w2, s13, s2 = experts(e, 64, i, wide * i, dtype, fmt, seed=t + k)
    ids, weights = routing(t, e, k, seed=t)
    x = torch.randn(t, 64, device=DEVICE).to(dtype)
    check(fused_moe(x, ids, weights, w13, w2, s13, s2, path=path),
          fused_moe_torch(x, ids, weights, w13, w2, s13, s2), dtype)


@pytest.mark.parametrize("fmt,dtype", [("dense", torch.float32), ("dense", torch.bfloat16), ("nvfp4", torch.bfloat16),
                                       ("mixed", torch.float32)])
@pytest.mark.parametrize("apart_from", [None, 1, 40], ids=["in-grid", "apart", "apart-from-40"])
@pytest.mark.parametrize("t", [5, 40])
def test_shared_expert_apart_at_prefill_sizes(fmt, dtype, apart_from, t, monkeypatch):
    """From tuning.MOE_SHARED_DENSE_MIN_TOKENS tokens the shared expert runs as dense GEMMs
    (shared_expert_dense) and the grouped launches hold the routed pairs only (K slots, E
    experts); the combine adds its rows. Below (and with None), it is slot K in the grid."""
    monkeypatch.setattr(tuning, "MOE_SHARED_DENSE_MIN_TOKENS", apart_from)
    grouped = spy_launches(monkeypatch, moe_grouped, "_moe_grouped_kernel", "SLOTS", "N_EXP")
    combine = spy_launches(monkeypatch, moe_grouped, "_moe_combine_kernel", "SLOTS", "HAS_SHARED")
    e, i, k = 8, 32, 3
    w13, w2, s13, s2 = experts(e, 64, i, 2 * i, dtype, fmt, seed=t)
    ids, weights = routing(t, e, k, seed=t)
    x = torch.randn(t, 64, device=DEVICE).to(dtype)
    check(fused_moe(x, ids, weights, w13, w2, s13, s2, path="grouped"),
          fused_moe_torch(x, ids, weights, w13, w2, s13, s2), dtype)
    apart = apart_from is not None and t >= apart_from
    assert {launch[1:] for launch in grouped} == {(k, e) if apart else (k + 1, e + 1)}
    assert [launch[1:] for launch in combine] == [(k if apart else k + 1, True)]


def test_shared_chunks():
    assert moe_gemv.shared_chunks(512, 1024, 6) == (2, 512)   # flint-40b: 6 routed + 2 shared slots
    assert moe_gemv.shared_chunks(512, 512, 6) == (1, 512)
    assert moe_gemv.shared_chunks(512, 1024, 7) == (1, 1024)  # 7 + 2 > 8 slots: one wide slot
    assert moe_gemv.shared_chunks(64, 96, 2) == (1, 96)       # not a multiple: one slot


@pytest.mark.skipif(DEVICE == "cuda", reason="emulates the interpreter's truncating fp32 -> bf16 casts")
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("i_s", [32, 64], ids=["Is=I", "Is=2I"])
def test_bf16_rounding_points_are_moes(path, i_s):
    """moe.py's bf16 roundings, each emulated as the interpreter casts (truncation), in fp64
    otherwise: the kernels' outputs are bit-identical, so they round at exactly those points (the
    shared expert's output once, also when its 2I rows run as two slots). A fixed x: the kernels'
    fp32 sums can land across a truncation boundary from the fp64 ones (over 40 random x, one
    gave the small path 3-5 other values, none the grouped path), which is no rounding point."""
    t, e, k = 3, 16, 4
    w13, w2, s13, s2 = experts(e, 64, 32, i_s, torch.bfloat16, "dense", seed=6)
    ids, weights = routing(t, e, k, seed=6)
    x = torch.randn(t, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)

    def cast(v):
        return (v.float().view(torch.int32) & -65536).view(torch.float32).double()

    def swiglu(a, w13, w2):
        gate, up = cast(a.double() @ w13.double().T).chunk(2, -1)
        return cast(cast(cast(gate / (1 + torch.exp(-gate))) * up) @ w2.double().T)

    routed = torch.zeros(t, 64, dtype=torch.float64)
    for i in range(t):
        for j in range(k):
            routed[i] += weights[i, j].double() * swiglu(x[i:i + 1], w13[ids[i, j]], w2[ids[i, j]])[0]
    expected = cast(cast(routed) + swiglu(x, s13, s2)).to(torch.bfloat16)
    assert torch.equal(fused_moe(x, ids, weights, w13, w2, s13, s2, path=path), expected)


def test_sort_pairs_torch_groups_by_expert_in_padded_blocks():
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]], dtype=torch.int32, device=DEVICE)
    pairs, block_expert = sort_pairs_torch(ids, 4, has_shared=True, block_m=2)
    p = 9  # 3 tokens x (2 routed + shared)
    # pair = token * 3 + slot; expert 0: pairs 1, 6 | expert 2: 0, 3, 7 (+pad) | expert 3: 4 (+pad)
    # | shared (id 4): 2, 5, 8 (+pad)
    expected = [1, 6, 0, 3, 7, p, 4, p, 2, 5, 8, p]
    assert pairs.tolist()[:len(expected)] == expected and set(pairs.tolist()[len(expected):]) <= {p}
    assert block_expert.tolist()[:6] == [0, 2, 2, 3, 4, 4] and min(block_expert.tolist()[6:]) >= 5


@pytest.mark.parametrize("hist_min_chunks", [moe_sort.HIST_MIN_CHUNKS, 2, 1 << 30])
@pytest.mark.parametrize("t,e,k,shared,block_m", [(3, 4, 2, True, 2), (40, 16, 4, True, 16), (17, 8, 8, False, 4),
                                                  (70, 16, 1, True, 16), (200, 16, 6, True, 8)])
def test_sort_pairs_kernel_matches_torch(t, e, k, shared, block_m, hist_min_chunks, monkeypatch):
    """Same runs, padding and block table; pairs within a run in any order (several programs), with
    the chunks' histograms from a launch of their own and from each program's loop."""
    monkeypatch.setattr(moe_sort, "HIST_MIN_CHUNKS", hist_min_chunks)
    ids, _ = routing(t, e, k, seed=t)
    ids[: t // 2, 0] = 1  # a crowded expert
    got, expected = sort_pairs(ids, e, shared, block_m), sort_pairs_torch(ids, e, shared, block_m)
    n_exp = e + shared
    assert torch.equal(got[1].clamp(max=n_exp), expected[1].clamp(max=n_exp))
    rows_expert = expected[1].clamp(max=n_exp).repeat_interleave(block_m)
    for x in range(n_exp + 1):  # each expert's run (and the unused tail) holds the same pairs
        run = rows_expert == x
        assert torch.equal(got[0][run].sort().values, expected[0][run].sort().values)


def transformers_moe(config, seed, dtype):
    """transformers' FlintSparseMoeBlock with random weights (the router's in fp32), in dtype ->
    (block, (w13, w2, shared_w13, shared_w2) in our stacked layout)."""
    moe = hf.FlintSparseMoeBlock(transformers.FlintConfig(**config.to_dict()))
    g = torch.Generator().manual_seed(seed)
    for p in moe.parameters():
        p.data = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
    moe = moe.to(DEVICE, dtype)
    moe.gate.weight.data = moe.gate.weight.data.float()  # kept in fp32, as from_pretrained keeps it
    sh = moe.shared_expert
    # gate_up_proj [E, 2I, H] is gate rows then up rows: our w13 layout
    return moe, (moe.experts.gate_up_proj.data, moe.experts.down_proj.data,
                 torch.cat([sh.gate_proj.weight, sh.up_proj.weight]).detach(), sh.down_proj.weight.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_twin_matches_transformers_moe(dtype):
    """fused_moe_torch (and both kernel paths) on transformers' router picks == its
    FlintSparseMoeBlock: the shared expert 2I wide (flint-tiny: 128 against 64), added ungated.
    bf16: transformers accumulates the weighted expert outputs in bf16, we in fp32 (moe.py)."""
    config = FlintConfig.preset("flint-tiny")
    assert config.shared_expert_intermediate_size == 2 * config.moe_intermediate_size
    moe, weights = transformers_moe(config, 5, dtype)
    x = torch.randn(9, config.hidden_size, device=DEVICE).to(dtype)
    with torch.no_grad():
        _, topk_weights, ids = moe.gate(x)
        expected = moe(x[None])[0]
    got = fused_moe_torch(x, ids.int(), topk_weights, *weights)
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, **FP32_TOL)
    else:
        assert_scaled_close(got, expected, rel=1e-2)
    for path in PATHS:
        check(fused_moe(x, ids.int(), topk_weights, *weights, path=path), got, dtype)


def test_errors_name_the_argument():
    w13, w2, s13, s2 = experts(4, 64, 32, 32, torch.float32, "dense")
    ids, weights = routing(2, 4, 2)
    x = torch.randn(2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe(x, ids.long(), weights, w13, w2)
    with pytest.raises(ValueError, match="w2"):
        fused_moe(x, ids, weights, w13, w2[:, :32])
    with pytest.raises(ValueError, match="shared"):
        fused_moe(x, ids, weights, w13, w2, s13, None)
    with pytest.raises(ValueError, match="path"):
        fused_moe(x, ids, weights, w13, w2, path="fast")
    assert fused_moe(x[:0], ids[:0], weights[:0], w13, w2, s13, s2).shape == (0, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", ["dense", "nvfp4"])
@pytest.mark.parametrize("t", [1, 8, 64, 1000])
def test_real_shapes(path, fmt, t, words):
    if path == "small" and t > 64:
        pytest.skip("the GEMV path is for decode batches")
    if words and (path, fmt) != ("small", "nvfp4"):
        pytest.skip("the NVFP4 decode is the small-batch path's NVFP4 decode")
    e, k = 256, 6
    w13, w2, s13, s2 = experts(e, 2048, 512, 1024, torch.bfloat16, fmt)
    ids, weights = routing(t, e, k)
    x = torch.randn(t, 2048, device=DEVICE, dtype=torch.bfloat16)
    assert_scaled_close(fused_moe(x, ids, weights, w13, w2, s13, s2, path=path),
                        fused_moe_torch(x, ids, weights, w13, w2, s13, s2), rel=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("unsorted", [False, True], ids=["sorted", "unsorted"])
@pytest.mark.parametrize("t", [8, 64, 256])
def test_real_shapes_with_the_handoff(t, unsorted, monkeypatch):
    """The grouped decode tiles with tuning.MOE_HANDOFF on a GPU, where down's programs run beside
    gate/up's (with their blocks from the sort, or straight from the ids: MOE_UNSORTED_MAX_TOKENS):
    flint-40b's shapes against the torch twin, and the same bits on every call (ten calls: a race
    would show as a changed output or a counter left set)."""
    monkeypatch.setattr(tuning, "MOE_HANDOFF", True)
    monkeypatch.setattr(tuning, "MOE_UNSORTED_MAX_TOKENS", 256 if unsorted else None)
    e, k = 256, 6
    w13, w2, s13, s2 = experts(e, 2048, 512, 1024, torch.bfloat16, "nvfp4")
    ids, weights = routing(t, e, k)
    x = torch.randn(t, 2048, device=DEVICE, dtype=torch.bfloat16)
    got = fused_moe(x, ids, weights, w13, w2, s13, s2, path="grouped")
    assert_scaled_close(got, fused_moe_torch(x, ids, weights, w13, w2, s13, s2), rel=1e-2)
    for _ in range(10):
        assert torch.equal(fused_moe(x, ids, weights, w13, w2, s13, s2, path="grouped"), got)
    assert not split_k.arrival_counters(1, x.device).any()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["dense", "nvfp4"])
@pytest.mark.parametrize("t", [1000, 4096])
def test_real_shapes_with_the_shared_expert_apart(fmt, t, monkeypatch):
    """tuning.MOE_SHARED_DENSE_MIN_TOKENS on a GPU at prefill sizes: the shared expert through
    nvfp4_linear or cuBLAS, the routed pairs through the grouped launches, against the torch twin."""
    monkeypatch.setattr(tuning, "MOE_SHARED_DENSE_MIN_TOKENS", 1)
    e, k = 256, 6
    w13, w2, s13, s2 = experts(e, 2048, 512, 1024, torch.bfloat16, fmt)
    ids, weights = routing(t, e, k)
    x = torch.randn(t, 2048, device=DEVICE, dtype=torch.bfloat16)
    assert_scaled_close(fused_moe(x, ids, weights, w13, w2, s13, s2, path="grouped"),
                        fused_moe_torch(x, ids, weights, w13, w2, s13, s2), rel=1e-2)
