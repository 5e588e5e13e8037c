"""Module knobs set for one call: the launchers read their switches (e.g. nvfp4_linear's
DEQUANT_MIN_TOKENS) at each launch, so a benchmark or a compile case can flip one around a call.
(A module of its own: compile_kernels.py, which also uses it, clears TRITON_INTERPRET on import.)"""


def with_knob(module, name: str, value, call):
    """Runs call() with module.<name> set to value, restored after."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        return call()
    finally:
        setattr(module, name, saved)
