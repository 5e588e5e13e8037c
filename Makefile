# `make test` installs what is missing into .venv and runs the suite; `make serve` serves the
# tiny checkpoint (or CKPT) with tritonserver; `make serve-openai` adds the OpenAI-compatible
# server in front of it (on OPENAI_PORT) with the announcement's chat flags.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.installed-serve
CKPT   ?= checkpoints/flint-tiny
# the configured repository that serve and serve-openai write and serve: a copy of the tracked
# model_repository/ (left as it is) with the configuration of CKPT and SERVE_ARGS; git ignores build/
REPOSITORY ?= build/model_repository
# more flint_backend.serving.configure flags, e.g. SERVE_ARGS="--device cuda --kernel-backend triton
#   --enable-auto-tool-choice --tool-call-parser glm47 --reasoning-parser glm47"
SERVE_ARGS ?=
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
# what tritonserver's HTTP, gRPC and metrics ports bind to. Empty: `make serve` listens on all
# interfaces (Triton is the API there, for clients on other hosts too; 127.0.0.1 if FLINT_API_KEY
# is set), `make serve-openai` on 127.0.0.1 (the OpenAI server and its key are the front door:
# Triton, which checks no key, must not be reachable around it). ADDRESS=0.0.0.0 or a host's address.
ADDRESS ?=
OPENAI_STAMP := $(VENV)/.installed-openai
OPENAI_PORT ?= 9000
# the announcement's flags: the repository gets them (for direct Triton clients) and so does the OpenAI server
CHAT_FLAGS ?= --enable-auto-tool-choice --tool-call-parser glm47 --reasoning-parser glm47 \
	--exclude-tools-when-tool-choice-none
# more OpenAI server flags, e.g. OPENAI_ARGS="--api-key KEY --served-model-name flint"
OPENAI_ARGS ?=

.PHONY: install test checkpoint serve serve-openai clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU build of torch lies on this machine's disk; a bare `torch` would pull a CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The kernel and engine tests (in-process, bound by the CPU interpreter) run on TEST_WORKERS
# processes (pytest-xdist, each file on one worker): on 2 cores 7.5 instead of 14 minutes
# (2026-12-06, 7319da6; 10.1 minutes at 8612c08). The rest starts servers and processes of its own
# and runs one test at a time (7.7 minutes at 8612c08).
# Exit status 5 (PYTEST_ARGS selected nothing in one of the two) is no failure.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) tests/kernels tests/engine || [ $$? -eq 5 ]
	$(PY) -m pytest -q $(PYTEST_ARGS) --ignore=tests/kernels --ignore=tests/engine || [ $$? -eq 5 ]

checkpoint: $(STAMP)
	test -f $(CKPT)/config.json || $(PY) scripts/make_checkpoint.py --preset flint-tiny --out $(CKPT)

# The system's tritonserver when there is one, else the nvidia-pytriton wheel's (extra `server`).
$(SERVE_STAMP): $(STAMP)
	command -v tritonserver >/dev/null || $(PY) -m pip install -q -e '.[server]'
	$(PY) -m pip install -q -e '.[client]'
	touch $(SERVE_STAMP)

serve: $(SERVE_STAMP) checkpoint
	$(PY) -m flint_backend.serving.configure --repository $(REPOSITORY) --model $(CKPT) $(SERVE_ARGS)
	$(PY) -m flint_backend.serving.launch --model-repository $(REPOSITORY) $(if $(ADDRESS),--address $(ADDRESS)) \
		--http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

$(OPENAI_STAMP): $(SERVE_STAMP)
	$(PY) -m pip install -q -e '.[openai]'
	touch $(OPENAI_STAMP)

serve-openai: $(OPENAI_STAMP) checkpoint
	$(PY) -m flint_backend.serving.configure --repository $(REPOSITORY) --model $(CKPT) $(CHAT_FLAGS) $(SERVE_ARGS)
	PYTHON=$(PY) REPOSITORY=$(REPOSITORY) ADDRESS=$(or $(ADDRESS),127.0.0.1) HTTP_PORT=$(HTTP_PORT) GRPC_PORT=$(GRPC_PORT) METRICS_PORT=$(METRICS_PORT) \
		scripts/serve_openai.sh --port $(OPENAI_PORT) $(CHAT_FLAGS) $(OPENAI_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build
