# Two entry points for a fresh machine (Python 3.10+ with venv):
#   make run    install, then start the gRPC server with the bundled "wiki" collection
#   make test   install with test extras, then run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run demo test install install-test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'

run: install
	$(BIN)/vindex serve --data ./vindex-data --sample wiki

demo: install
	$(BIN)/vindex demo

test: install-test
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m bench.recall_qps --dataset glove-100k

clean:
	rm -rf $(VENV) vindex-data build dist *.egg-info
