"""tools/bench/format_processes.py: a benchmark's child process gets the parent's arguments but its own
--formats and --out."""

from tools.bench.format_processes import without_flags


def test_without_flags_drops_formats_and_out_with_their_values():
    argv = ["--formats", "nvfp4,bf16", "--context", "100000", "--out=x.json", "--variant", "a.B=1",
            "--formats=bf16", "--out", "y.json", "--steps", "12"]
    assert without_flags(argv) == ["--context", "100000", "--variant", "a.B=1", "--steps", "12"]
    assert without_flags(["--variant", "m.X=0"], ("--variant",)) == []


def test_each_format_runs_one_format_here():
    from tools.bench.format_processes import each_format
    assert each_format("nvfp4", False, lambda fmt: {"format": fmt}, "tools.bench.unused") == [{"format": "nvfp4"}]
    assert each_format("nvfp4,bf16", True, lambda fmt: {"format": fmt}, "tools.bench.unused") == [
        {"format": "nvfp4"}, {"format": "bf16"}]  # a child told --one-format runs what it is given
