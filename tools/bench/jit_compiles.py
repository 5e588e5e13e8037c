"""The Triton kernels a block of code specialised for the first time in this process.

Triton compiles a kernel for each new specialisation of its arguments on its first launch in a
process (an int specialises on == 1 and on divisibility by 16, a pointer on 16-byte alignment):
seconds for the prefill kernels, or a read of Triton's on-disk cache when an earlier process
compiled it. A timed run that meets one its warm-up did not is slower by that much, and so is the
first request of a served engine that meets it. JitCompiles records each miss of the in-memory
kernel cache (triton.knobs.runtime.jit_cache_hook) while it is entered; under the interpreter
nothing compiles and it records nothing.

    with JitCompiles() as compiles:
        run()
    compiles.reprs  # ["_prefill_kernel[num_warps=8, ...](q_ptr: *bf16, ..., num_seqs: i32, ...)", ...]
"""

from __future__ import annotations

from triton import knobs


class JitCompiles:
    def __init__(self):
        self.reprs: list[str] = []
        self._outer = None

    def __enter__(self) -> JitCompiles:
        self._outer = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = self._hook
        return self

    def __exit__(self, *exc) -> None:
        knobs.runtime.jit_cache_hook = self._outer

    def _hook(self, *, repr: str, **kwargs):
        self.reprs.append(repr)
        # a true return skips the compile: whatever hook was installed before still decides
        return self._outer(repr=repr, **kwargs) if self._outer is not None else None

    def names(self) -> list[str]:
        """The kernels' names, one per specialisation, in the order they were met."""
        return [r.split("[", 1)[0] for r in self.reprs]
