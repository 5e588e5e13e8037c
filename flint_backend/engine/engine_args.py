"""Engine arguments: one place, loadable from the JSON file beside the Triton model."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from flint_backend.config import PRESETS
from flint_backend.ops import BACKENDS
from flint_backend.tokenizer import TOKENIZER_DIR

DTYPES = ("bfloat16", "float32")
# the KV cache's element type (vLLM's spellings): "auto" is the model dtype; "fp8" / "fp8_e4m3" store
# E4M3 with a scale per layer for K and for V (kv_cache.py), half the bytes of bfloat16
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3")


class EngineArgsError(ValueError):
    pass


@dataclass
class EngineArgs:
    model: str | None = None              # HF checkpoint dir or .gguf file; None -> random weights of `preset`,
                                          #   built on the device (flint-40b: 80 GB bf16, never on disk)
    preset: str = "flint-tiny"            # used only when model is None
    quantization: str | None = None       # random weights only: "nvfp4" quantises them as an NVFP4 GGUF would
    hf_config_path: str | None = None     # config.json (dir) for a GGUF model
    tokenizer: str | None = None          # tokenizer dir; default: the model dir (or the project's)
    seed: int = 0                         # random weights' seed when model is None; sampler seed
    dtype: str = "bfloat16"
    device: str = "auto"                  # "auto" -> cuda if available else cpu; "cpu", "cuda", "cuda:N"
    kernel_backend: str = "torch"         # "torch" or "triton"
    kv_cache_dtype: str = "auto"          # "auto" (the model dtype), "bfloat16", "fp8" / "fp8_e4m3"
    block_size: int = 64                  # tokens per paged KV block (full-attention layers)
    max_num_seqs: int = 64                # running sequences (= sliding-window ring rows)
    # token budget per step (prefill chunk size). H100 2026-12-06, flint-40b NVFP4, TTFT of 8K / 32K /
    # 100K tokens: 2048 0.311 / 1.54 / 7.43 s, 8192 0.226 / 1.18 / 6.33 s, 16384 0.226 / 1.12 / 6.14 s
    # (bench.py --ttft-chunks). Multiples of 132 SMs x 64: whole waves of full-layer prefill
    # attention programs (one an SM) and of the 128-row GEMM tiles; H100 2026-12-07 (41a0aec), 100K
    # TTFT 4.116 s in 8192-token chunks, 4.049 in 8448, 3.987 in 16896. A step never exceeds it
    max_num_batched_tokens: int = 16896
    # token budget of a step that also decodes: the streams wait for it (their inter-token latency),
    # so 8448 there, twice as long a stall for -1.5% of a long prompt's TTFT not being worth it.
    # None (or above max_num_batched_tokens): max_num_batched_tokens
    max_num_batched_tokens_with_decodes: int | None = 8448
    max_model_len: int | None = None      # None -> the config's max_position_embeddings
    num_kv_blocks: int | None = None      # fixed pool size; None -> sized from the memory budget
    kv_cache_memory_fraction: float = 0.9  # GPU: fraction of free memory (after weights) for the KV cache
    kv_cache_memory_bytes: int = 1 << 30  # CPU: KV budget in bytes
    # reuse the KV of a cached token prefix across requests (engine.prefix_cache; vLLM's name)
    enable_prefix_caching: bool = True
    # the prefix cache's sliding-window pages (one block's K/V of every sliding layer, kept so that a hit
    # can rebuild a window): None -> prefix_cache_window_fraction of the budget (num_kv_blocks fixed:
    # enough for 4 windows a running sequence); 0 -> full layers only, so no hit (the windows are needed)
    num_window_pages: int | None = None
    prefix_cache_window_fraction: float = 0.1
    enforce_eager: bool = False           # True: no CUDA graphs / static decode buffers
    max_graph_batch: int = 256            # largest decode batch replayed from a CUDA graph (a bucket each
    #                                       power of two up to min(this, max_num_seqs))
    # launch each all-decode step before the host has read the previous step's tokens, so the device
    # does not idle while Python appends them, checks stops and fills the next step (engine.py);
    # steps with prefill, logprobs, penalties, or enforce_eager run synchronously either way
    async_scheduling: bool = True
    cpu_threads: int | None = None        # CPU: torch intra-op threads; None -> torch's default
    # run a prefill step of each size class and two greedy requests through the engine when it
    # starts (LLMEngine.warm_up), so Triton compiles their kernels then and not during the first
    # requests (a 100K prompt on an H100 without it: 19.2 s the first time, 6.5 s after;
    # benchmarks/NOTES.md §34). None: on CUDA with the triton backend (where kernels compile), off elsewhere
    warmup: bool | None = None
    # a request still running this many seconds after it arrived is aborted (finish_reason "abort", its
    # tokens so far delivered): a bound for clients that leave without cancelling (Triton's HTTP
    # `generate` cannot tell the model its client left: docs/serving.md). None: no limit
    max_request_seconds: float | None = None

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise EngineArgsError(f"dtype: got {self.dtype!r}, expected one of {DTYPES}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise EngineArgsError(f"kv_cache_dtype: got {self.kv_cache_dtype!r}, expected one of {KV_CACHE_DTYPES}")
        if self.kv_cache_dtype == "bfloat16" and self.dtype != "bfloat16":
            raise EngineArgsError(f"kv_cache_dtype: 'bfloat16' with dtype {self.dtype!r}, expected 'auto' or 'fp8' "
                                  "(the attention reads the cache in the model dtype or as FP8)")
        if self.quantization not in (None, "nvfp4"):
            raise EngineArgsError(f"quantization: got {self.quantization!r}, expected null or 'nvfp4'")
        if self.quantization is not None and self.model is not None:
            raise EngineArgsError(f"quantization: {self.quantization!r} applies to random weights (model null); "
                                  f"model {self.model!r} is stored as it is (an NVFP4 GGUF is NVFP4 already)")
        if self.preset not in PRESETS:
            raise EngineArgsError(f"preset: got {self.preset!r}, expected one of {sorted(PRESETS)}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise EngineArgsError(f"seed: got {self.seed!r}, expected an integer >= 0")
        if self.kernel_backend not in BACKENDS:
            raise EngineArgsError(f"kernel_backend: got {self.kernel_backend!r}, expected one of {BACKENDS}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_graph_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise EngineArgsError(f"{name}: got {value!r}, expected a positive integer")
        for name in ("async_scheduling", "enable_prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise EngineArgsError(f"{name}: got {getattr(self, name)!r}, expected true or false")
        if self.num_window_pages is not None and (not isinstance(self.num_window_pages, int)
                                                  or isinstance(self.num_window_pages, bool) or self.num_window_pages < 0):
            raise EngineArgsError(f"num_window_pages: got {self.num_window_pages!r}, expected an integer >= 0 or null")
        if not 0.0 <= self.prefix_cache_window_fraction < 1.0:
            raise EngineArgsError(f"prefix_cache_window_fraction: got {self.prefix_cache_window_fraction!r}, "
                                  "expected [0, 1)")
        if self.warmup is not None and not isinstance(self.warmup, bool):
            raise EngineArgsError(f"warmup: got {self.warmup!r}, expected true, false or null")
        for name in ("max_model_len", "num_kv_blocks", "cpu_threads", "max_num_batched_tokens_with_decodes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise EngineArgsError(f"{name}: got {value!r}, expected a positive integer or null")
        if self.max_request_seconds is not None and (isinstance(self.max_request_seconds, bool) or not isinstance(
                self.max_request_seconds, (int, float)) or not self.max_request_seconds > 0):
            raise EngineArgsError(f"max_request_seconds: got {self.max_request_seconds!r}, expected a number of "
                                  "seconds > 0 or null")
        if not 0.0 < self.kv_cache_memory_fraction <= 1.0:
            raise EngineArgsError(f"kv_cache_memory_fraction: got {self.kv_cache_memory_fraction!r}, expected (0, 1]")

    @classmethod
    def from_dict(cls, data: dict) -> "EngineArgs":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise EngineArgsError(f"engine args: unknown key(s) {unknown}; known keys: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, path: str | Path) -> "EngineArgs":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def tokenizer_dir(self) -> Path:
        """`tokenizer`, else the checkpoint directory, else the GGUF's hf_config_path, else ours."""
        for candidate in (self.tokenizer, self.model, self.hf_config_path):
            if candidate and Path(candidate).is_dir():
                return Path(candidate)
        return TOKENIZER_DIR

    def to_dict(self) -> dict:
        return asdict(self)
