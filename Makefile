# `make test` installs what is missing into .venv and runs the suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CKPT   ?= checkpoints/flint-tiny

.PHONY: install test checkpoint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU build of torch lies on this machine's disk; a bare `torch` would pull a CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

checkpoint: $(STAMP)
	test -f $(CKPT)/config.json || $(PY) scripts/make_checkpoint.py --preset flint-tiny --out $(CKPT)

clean:
	rm -rf $(VENV) .pytest_cache
