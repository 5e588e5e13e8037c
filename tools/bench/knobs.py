"""Module knobs set for one call: the launchers read their tuning switches (flint_kernels/tuning.py,
e.g. FP4_DEQUANT_MIN_TOKENS) at each launch, so a benchmark or a compile case can flip one around a
call: `with_knob(tuning, "FP4_DEQUANT_MIN_TOKENS", None, call)`. (A module of its own:
compile_kernels.py, which also uses it, must run without Triton's interpreter, so it sets that up
before its first import of the kernels.)"""


def with_knob(module, name: str, value, call):
    """Runs call() with module.<name> set to value, restored after."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        return call()
    finally:
        setattr(module, name, saved)
