"""tools/bench/bench_kernels.py's W4A16 section: at a prefill chunk's size each projection's NVFP4
GEMM has a BF16 twin (the dequantised weight, a plain matmul) that bench_kernels checks like
every case: against dequantise-then-matmul."""

import torch

from tools.bench.bench_kernels import PREFILL_TOKENS, SMOKE, bench_w4a16, check


def test_prefill_gemms_have_a_bf16_linear_twin():
    cases = bench_w4a16(SMOKE, torch.device("cpu"), smoke=False)  # the full token counts, tiny shapes
    twins = [c for c in cases if c.name.endswith(" bf16 linear")]
    # flint-tiny's projections (k->n): qkv 64 -> 128 + 2 x 32, o_proj, the dense MLP; no LM head
    assert [c.name for c in twins] == [f"{p} T={PREFILL_TOKENS} bf16 linear" for p in
                                       ("qkv 64->192", "o_proj 128->64", "mlp gate_up 64->256", "mlp down 128->64")]
    assert f"lm_head 64->1000 T={PREFILL_TOKENS}, 2 weights" not in [c.name for c in cases]
    for twin, (k, n) in zip(twins, [(64, 192), (128, 64), (64, 256), (128, 64)]):
        status, rel_err = check(twin)
        assert status == "ok" and rel_err < 1e-2, (twin.name, status, rel_err)
        assert twin.run().shape == (PREFILL_TOKENS, n) and twin.flops == 2 * PREFILL_TOKENS * n * k


def test_prefill_gemm_forms_restore_the_knobs():
    # the "bf16 tiles", "decoding tiles" and "128x256 tiles" rows set a tuning switch for their
    # call only, and each is checked like every case (against dequantise-then-matmul)
    from flint_kernels import tuning
    before = (tuning.FP4_DEQUANT_MIN_TOKENS, tuning.FP4_DEQUANT_GEMM_TILES, tuning.FP4_MMA_F16)
    cases = bench_w4a16(SMOKE, torch.device("cpu"), smoke=False, prefill_tokens=96)  # a chunk the interpreter runs fast
    forms = [c for c in cases if c.name.startswith("qkv ") and c.name.endswith(" tiles")]
    assert [c.name for c in forms] == ["qkv 64->192 T=64 bf16 tiles"] + [
        f"qkv 64->192 T=96 {f}" for f in ("decoding tiles", "128x256 tiles")]
    for case in forms:
        case.prepare()
        status, rel_err = check(case)
        assert status == "ok" and rel_err < 1e-2, (case.name, status, rel_err)
        assert (tuning.FP4_DEQUANT_MIN_TOKENS, tuning.FP4_DEQUANT_GEMM_TILES, tuning.FP4_MMA_F16) == before
