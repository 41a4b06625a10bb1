# Two commands for a fresh machine:  `make run` (the main job on the default data)  and  `make test`.
PYTHON ?= python3
# More pytest options, e.g. PYTEST_ARGS="-m 'not slow'" to leave out the tests that take seconds each.
PYTEST_ARGS ?=
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run test lint clean

$(BIN)/cnnlab: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,lint]'
	touch $@

setup: $(BIN)/cnnlab

run: setup
	$(BIN)/python -m cnnlab cpu

lint: setup
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q -rs $(PYTEST_ARGS)  # -rs: the reason for every skip

clean:
	rm -rf $(VENV) out build *.egg-info
