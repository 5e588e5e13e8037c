import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tokenizer(tiny_checkpoint):
    from flint_backend.tokenizer import load_tokenizer

    return load_tokenizer(tiny_checkpoint)


@pytest.fixture(scope="session")
def reference_texts(tiny_checkpoint, tokenizer):
    from reference_texts import greedy_reference_texts

    return greedy_reference_texts(tiny_checkpoint, tokenizer)
