"""Records a module's kernel launches while still running them: the tests of launch shapes."""


def spy_launches(monkeypatch, module, name: str, *keys: str) -> list:
    """Replaces module.<name> (a @triton.jit kernel) for the test: every launch runs as before and
    appends (grid, kwargs[key] for each key) to the list returned."""
    kernel = getattr(module, name)
    launches = []

    class Spy:
        def __getitem__(self, grid):
            def run(**kwargs):
                launches.append((grid, *(kwargs[key] for key in keys)))
                return kernel[grid](**kwargs)
            return run

    monkeypatch.setattr(module, name, Spy())
    return launches
