"""The Triton kernels a block of code specialised for the first time in this process.

Triton compiles a kernel for each new specialisation of its arguments on its first launch in a
process (an int specialises on == 1 and on divisibility by 16, a pointer on 16-byte alignment,
and every constexpr value is its own kernel): seconds for the prefill kernels, or a read of
Triton's on-disk cache when an earlier process compiled it. A timed run that meets one its
warm-up did not is slower by that much, and so is the first request of a served engine that
meets it. JitCompiles records each miss of the in-memory kernel cache
(triton.knobs.runtime.jit_cache_hook) while it is entered; under the interpreter nothing compiles
and it records nothing. Entered inside another, both record.

    with JitCompiles() as seen:
        warm_up()
        earlier = list(seen.specs)
        with JitCompiles() as timed:
            run()
    for spec in timed.specs:
        print(describe(spec), "|", difference(spec, earlier))
"""

from __future__ import annotations

from triton import knobs


class JitCompiles:
    def __init__(self):
        self.specs: list[dict] = []
        self._outer = None

    def __enter__(self) -> JitCompiles:
        self._outer = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = self._hook
        return self

    def __exit__(self, *exc) -> None:
        knobs.runtime.jit_cache_hook = self._outer

    def _hook(self, *, fn, compile, **kwargs):
        self.specs.append(specialisation(fn, compile))
        # a true return skips the compile: whatever hook was installed before still decides
        return self._outer(fn=fn, compile=compile, **kwargs) if self._outer is not None else None


def specialisation(fn, compile: dict) -> dict:
    """-> {"kernel": name, "options": "num_warps=.., num_stages=..", "args": {param: what it was
    specialised to}} from the hook's fn (JitFunctionInfo) and compile arguments: a constexpr (or
    an int specialised as 1) by its value, a runtime argument by its type, "%16" added where
    Triton assumed it divisible by 16."""
    params = [p.name for p in fn.jit_function.params]
    constants = {path[0]: value for path, value in compile["constants"].items() if len(path) == 1}
    divisible = {path[0] for path, attr in compile["configs"][0].items()
                 if len(path) == 1 and any(a[0] == "tt.divisibility" for a in attr)}
    args = {}
    for i, (name, kind) in enumerate(compile["signature"].items()):
        if kind == "constexpr":
            args[name] = repr(constants.get(i))
        else:
            args[name] = f"{kind} %16" if i in divisible else kind
    assert list(args) == params[:len(args)], "signature out of parameter order"
    return {"kernel": fn.name, "options": f"num_warps={compile['num_warps']}, num_stages={compile['num_stages']}",
            "args": args}


def describe(spec: dict) -> str:
    args = ", ".join(f"{k}={v}" for k, v in spec["args"].items())
    return f"{spec['kernel']}[{spec['options']}]({args})"


def difference(spec: dict, earlier: list[dict]) -> str:
    """What sets `spec` apart from the closest earlier specialisation of its kernel (fewest
    arguments or options that differ): "T: i32 -> i32 %16, BLOCK_M: 16 -> 64"."""
    same = [e for e in earlier if e["kernel"] == spec["kernel"]]
    if not same:
        return "the kernel's first specialisation"

    def changes(e: dict) -> list[str]:
        out = [f"{k}: {e['args'].get(k)} -> {v}" for k, v in spec["args"].items() if e["args"].get(k) != v]
        return out + ([f"{e['options']} -> {spec['options']}"] if e["options"] != spec["options"] else [])

    return ", ".join(min((changes(e) for e in same), key=len))
