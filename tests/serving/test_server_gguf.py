"""tritonserver serving an NVFP4 GGUF as the announcement does (`--hf-config-path` and `--tokenizer`
naming the BF16 directory): its greedy text is that of transformers' FlintForCausalLM on the
GGUF's exactly dequantised weights (the W4A16 oracle)."""

import pytest
import torch

from flint_backend.chat.request import encode_text_input
from flint_backend.weights.convert import convert_checkpoint
from flint_backend.weights.loader import load_checkpoint
from oracle import TIE_MARGIN, NearTie, greedy, oracle_model
from reference_texts import CANDIDATE_PROMPTS
from triton_server import TritonServer, configured_repository

pytest.importorskip("tritonclient.grpc")
pytestmark = pytest.mark.server
N_TOKENS = 8


@pytest.fixture(scope="module")
def gguf(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf") / "flint-tiny-nvfp4.gguf"
    convert_checkpoint(tiny_checkpoint, out, outtype="nvfp4", progress=False)
    return out


@pytest.fixture(scope="module")
def server(gguf, tiny_checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triton-gguf")
    repo = configured_repository(tmp, str(gguf), "--hf-config-path", str(tiny_checkpoint), "--tokenizer",
                                 str(tiny_checkpoint), "--device", "cpu", "--dtype", "float32", "--cpu-threads", "1",
                                 "--block-size", "16", "--num-kv-blocks", "256", "--max-model-len", "256")
    with TritonServer(repo, tmp / "tritonserver.log") as s:
        yield s


def test_the_nvfp4_gguf_serves_the_w4a16_oracles_greedy_text(server, gguf, tiny_checkpoint, tokenizer):
    ckpt = load_checkpoint(gguf, hf_config_path=tiny_checkpoint, dtype=torch.float32, progress=False)
    oracle = oracle_model(ckpt.config, ckpt.tensors, torch.float64)
    checked = 0
    for prompt in CANDIDATE_PROMPTS:
        try:
            ids = greedy(oracle, encode_text_input(tokenizer, prompt), N_TOKENS, tie_margin=TIE_MARGIN)
        except NearTie:
            continue
        status, body = server.generate({"text_input": prompt, "max_tokens": N_TOKENS, "temperature": 0.0,
                                        "ignore_eos": True})
        assert status == 200, body
        assert body["text_output"] == tokenizer.decode(ids, skip_special_tokens=True), prompt
        checked += 1
    assert checked >= 3
