# Flint on NVIDIA Triton Inference Server: the model repository on NVIDIA's server image.
#
# Build (both architectures of the image):
#   docker buildx build --platform linux/amd64,linux/arm64 -t flint-triton .
# Serve a checkpoint from the mounted Hugging Face cache, with the announcement's flags
# (arguments are flint_backend.serving.configure's, as `make serve` passes them):
#   docker run --gpus all --ipc=host -p 8000:8000 -p 8001:8001 -p 8002:8002 \
#     -v ~/.cache/huggingface:/root/.cache/huggingface flint-triton \
#     RecursiveSI/flint-nvfp4-gguf --hf-config-path RecursiveSI/flint --tokenizer RecursiveSI/flint \
#     --enable-auto-tool-choice --tool-call-parser glm47 --reasoning-parser glm47 \
#     --exclude-tools-when-tool-choice-none --kernel-backend triton
# 8000: HTTP (generate, generate_stream), 8001: gRPC (streaming), 8002: /metrics.

# 24.10 ships tritonserver 2.51, the version `make serve` runs from the nvidia-pytriton wheel.
ARG TRITON_RELEASE=24.10
FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3

ARG TORCH_VERSION=2.11.0
ENV HF_HUB_OFFLINE=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /opt/flint
COPY pyproject.toml README.md ./
COPY flint_backend ./flint_backend
COPY flint_kernels ./flint_kernels
COPY scripts ./scripts
# the GPU checks (tools/gpu/*.sh --no-bundle) and the benchmarks they time the engine with
COPY tools ./tools
COPY model_repository ./model_repository

# The server image has tritonserver: only the project, the client tools (perf_analyzer) and the
# OpenAI server (python3 -m flint_backend.openai, scripts/serve_openai.sh) go in.
RUN python3 -m pip install --no-cache-dir "torch==${TORCH_VERSION}" \
    && python3 -m pip install --no-cache-dir -e ".[client,openai]"

EXPOSE 8000 8001 8002 9000
ENTRYPOINT ["/opt/flint/scripts/docker_entrypoint.sh"]
CMD ["--help"]
