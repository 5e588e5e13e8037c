import os
import sys
import zlib
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/oracle.py: `from oracle import ...` in every folder

# Kernels run on the CPU through Triton's interpreter when no GPU is present (CI).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # The tests' tensors are tiny: intra-op threads cost more in synchronisation than they
    # save (10x slower engine steps on a 2-core machine that is also running other work).
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def seeded_torch(request):
    """Every test draws the same random tensors on every run (its own seed, from its id): a
    tolerance that holds here holds in CI."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A flint-tiny checkpoint (seed 0, bf16, one shard) shared by the whole session."""
    from scripts.make_checkpoint import make_checkpoint

    out = tmp_path_factory.mktemp("flint-tiny")
    make_checkpoint("flint-tiny", out, seed=0)
    return out


@pytest.fixture(scope="session")
def tokenizer(tiny_checkpoint):
    """The tiny checkpoint's tokenizer (tests with another define their own `tokenizer`)."""
    from flint_backend.tokenizer import load_tokenizer

    return load_tokenizer(tiny_checkpoint)


@pytest.fixture(scope="session")
def reference_texts(tiny_checkpoint, tokenizer):
    """The oracle's greedy texts of the served tiny checkpoint (tests/serving/reference_texts.py, on
    the path of tests/serving and tests/reliability): computed once for both."""
    from reference_texts import greedy_reference_texts

    return greedy_reference_texts(tiny_checkpoint, tokenizer)
