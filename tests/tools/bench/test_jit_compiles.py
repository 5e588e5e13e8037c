"""JitCompiles records what Triton's jit_cache_hook reports while entered and puts back the hook it
found. (A real compile needs a GPU: the hook is called here the way JITFunction._do_compile calls
it, with Triton 3.6's arguments.)"""

import triton.language as tl
from triton import knobs
from triton.runtime.jit import JITFunction, JitFunctionInfo

from tools.bench.jit_compiles import JitCompiles, describe, difference


def _kernel(x_ptr, T, stride, BLOCK: tl.constexpr):
    pass


KERNEL = JitFunctionInfo(__name__, "_kernel", JITFunction(_kernel))


def miss(t: str = "i32", t_divisible: bool = False, block: int = 64, warps: int = 4):
    """One in-memory cache miss of _kernel as Triton reports it (x_ptr 16-byte aligned, stride
    specialised as 1); -> the hook's answer (true: skip the compile)."""
    hook = knobs.runtime.jit_cache_hook
    attrs = {(0,): [["tt.divisibility", 16]]} | ({(1,): [["tt.divisibility", 16]]} if t_divisible else {})
    compile = {"signature": {"x_ptr": "*bf16", "T": t, "stride": "constexpr", "BLOCK": "constexpr"},
               "constants": {(2,): 1, (3,): block}, "configs": [attrs], "num_warps": warps, "num_stages": 3}
    return hook(key=None, repr="", fn=KERNEL, compile=compile, is_manual_warmup=False, already_compiled=False) \
        if hook else None


def test_records_misses_while_entered_and_restores_the_hook():
    before = knobs.runtime.jit_cache_hook
    miss(block=16)
    with JitCompiles() as outer:
        miss()
        with JitCompiles() as inner:
            miss(t_divisible=True, block=128)
        miss(warps=8)
    miss(block=32)
    assert knobs.runtime.jit_cache_hook is before
    assert len(inner.specs) == 1 and len(outer.specs) == 3 and outer.specs[1] == inner.specs[0]
    assert [s["kernel"] for s in outer.specs] == ["_kernel"] * 3
    assert describe(outer.specs[0]) == "_kernel[num_warps=4, num_stages=3](x_ptr=*bf16 %16, T=i32, stride=1, BLOCK=64)"
    assert difference(inner.specs[0], outer.specs[:1]) == "T: i32 -> i32 %16, BLOCK: 64 -> 128"
    assert difference(outer.specs[2], outer.specs[:2]) == "num_warps=4, num_stages=3 -> num_warps=8, num_stages=3"
    assert difference(outer.specs[0], []) == "the kernel's first specialisation"


def test_an_outer_hooks_answer_is_kept():
    skipped = []

    def skip(*, fn, **kwargs):
        skipped.append(fn.name)
        return True

    before = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = skip
    try:
        with JitCompiles() as compiles:
            assert miss() is True
        assert [s["kernel"] for s in compiles.specs] == ["_kernel"] and skipped == ["_kernel"]
    finally:
        knobs.runtime.jit_cache_hook = before
