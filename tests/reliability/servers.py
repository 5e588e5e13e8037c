"""The reliability suite's servers: one tritonserver on flint-tiny (CPU, fp32) with the chat
parsers, and the OpenAI server in front of it with an API key, shared by the soak and the fuzz.

The KV pool is small on purpose (NUM_KV_BLOCKS x BLOCK_SIZE tokens, less than MAX_NUM_SEQS
sequences of MAX_MODEL_LEN): the soak's 48-256 concurrent requests and the fault tests' long
prompts run into it, so queueing and preemption are part of what is soaked.
"""

from openai_server import OpenAIServer
from triton_server import TritonServer, configured_repository

KEY = "reliability-key"
CHAT_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "glm47", "--reasoning-parser", "glm47")
BLOCK_SIZE = 16
NUM_KV_BLOCKS = 512        # 8,192 tokens
MAX_MODEL_LEN = 512
MAX_NUM_SEQS = 64


def engine_flags(checkpoint, *extra: str) -> list[str]:
    return ["--model", str(checkpoint), "--device", "cpu", "--dtype", "float32", "--cpu-threads", "1",
            "--block-size", str(BLOCK_SIZE), "--num-kv-blocks", str(NUM_KV_BLOCKS),
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS), *CHAT_FLAGS, *extra]


def start_triton(checkpoint, tmp, *extra: str) -> TritonServer:
    repo = configured_repository(tmp, *engine_flags(checkpoint, *extra))
    return TritonServer(repo, tmp / "tritonserver.log")


def start_openai(triton: TritonServer, tmp) -> OpenAIServer:
    return OpenAIServer(triton.grpc_url, [*CHAT_FLAGS, "--api-key", KEY], tmp / "openai_server.log",
                        metrics_url=f"http://127.0.0.1:{triton.metrics_port}/metrics")
