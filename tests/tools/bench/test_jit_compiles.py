"""JitCompiles records what Triton's jit_cache_hook reports while entered and puts back the hook it
found. (A real compile needs a GPU: the hook is called here the way JITFunction._do_compile calls it.)"""

from triton import knobs

from tools.bench.jit_compiles import JitCompiles


def miss(text: str):
    """One in-memory cache miss as Triton reports it; -> the hook's answer (true: skip the compile)."""
    hook = knobs.runtime.jit_cache_hook
    return hook(key=None, repr=text, fn=None, compile={}, is_manual_warmup=False, already_compiled=False) if hook else None


def test_records_misses_while_entered_and_restores_the_hook():
    before = knobs.runtime.jit_cache_hook
    miss("_outside[num_warps=4](n: i32)")
    with JitCompiles() as outer:
        miss("_prefill_kernel[num_warps=8, num_stages=2](q_ptr: *bf16, num_seqs: i32)")
        with JitCompiles() as inner:
            miss("_rms_norm_kernel[num_warps=4](x_ptr: *bf16, n_rows: i32)")
        miss("_router_kernel[num_warps=4](T: i32)")
    miss("_after[num_warps=4](n: i32)")
    assert knobs.runtime.jit_cache_hook is before
    assert inner.names() == ["_rms_norm_kernel"]
    assert outer.names() == ["_prefill_kernel", "_rms_norm_kernel", "_router_kernel"]
    assert outer.reprs[0] == "_prefill_kernel[num_warps=8, num_stages=2](q_ptr: *bf16, num_seqs: i32)"


def test_an_outer_hooks_answer_is_kept():
    skipped = []

    def skip(*, repr, **kwargs):
        skipped.append(repr)
        return True

    before = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = skip
    try:
        with JitCompiles() as compiles:
            assert miss("_k[num_warps=4](n: i32)") is True
        assert compiles.names() == ["_k"] and skipped == ["_k[num_warps=4](n: i32)"]
    finally:
        knobs.runtime.jit_cache_hook = before
