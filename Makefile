# Two commands for a fresh machine:  `make run` (the main job on the default data)  and  `make test`.
PYTHON ?= python3
# More pytest options, e.g. PYTEST_ARGS="-m 'not slow'" to leave out the tests that take seconds each.
PYTEST_ARGS ?=
VENV := .venv
BIN := $(VENV)/bin
# The install's own output: out of sight, its last lines shown only where a step fails.
INSTALL_LOG := $(VENV)/install.log
# pyproject.toml's build requirements, installed into the venv once so that the build runs there (--no-build-isolation)
# rather than in a build env of its own, made anew at every install. pip 21.3 is the first to install a pyproject
# project editable; setuptools 77.0.3 writes setup.cfg's license_expression into the metadata (76 leaves it out).
BUILD_REQUIRES := 'setuptools>=77.0.3' 'pip>=21.3'
TEST_EXTRAS := test,lint
# pip compiles the bytecode of every file it installs, one at a time; instead, without the tests' files, on every core.
PIP_INSTALL := $(BIN)/python -m pip install --disable-pip-version-check --no-compile
COMPILE := $(BIN)/python -m compileall -q -j 0 -x /tests/
SITE_PACKAGES := $(VENV)/lib/python3*/site-packages
# What the install compiles: a change to any of it builds the native extensions again.
NATIVE_SOURCES := setup.py cnnlab/constants.py $(wildcard native/*) $(wildcard kernel/*.h)

# Every Python setup.cfg admits (its classifiers name each): make test-pythons tests the sdist on each of them but
# $(PYTHON)'s, which make test tests. More pytest options for those runs, e.g. PYTHONS_ARGS="-m 'not slow'".
PYTHONS := 3.10 3.11 3.12 3.13
PYTHONS_ARGS ?=

.PHONY: setup run test test-pythons lint typecheck clean

# $(call logged,COMMAND): COMMAND run with its output added to the install log; where it fails, the log's tail and
# where the whole log is.
logged = echo "+ $(1)" >>$(INSTALL_LOG); $(1) >>$(INSTALL_LOG) 2>&1 || { tail -n 20 $(INSTALL_LOG) >&2; \
	echo "make: failed: $(1); the whole log is $(INSTALL_LOG)" >&2; exit 1; }

# What running needs: numpy, and cnnlab installed editable with its native extensions built in place. Of the packages
# installed, only numpy's bytecode is compiled: the build tools' would take as long again, for one build. pip shows none
# of setup.py's output: where no compiler built an extension, cnnlab.extensions says so after it, in one line.
$(VENV)/installed-run: pyproject.toml setup.cfg $(NATIVE_SOURCES)
	@mkdir -p $(VENV) && : >$(INSTALL_LOG)
	@echo "make: installing cnnlab and numpy into $(VENV) (log: $(INSTALL_LOG))"
	@$(call logged,$(PYTHON) -m venv $(VENV))
	@$(call logged,$(PIP_INSTALL) $(BUILD_REQUIRES))
	@$(call logged,$(PIP_INSTALL) --no-build-isolation -e .)
	@$(call logged,$(COMPILE) $(SITE_PACKAGES)/numpy)
	@$(BIN)/python -m cnnlab.extensions
	@touch $@

# What testing adds: the test and lint extras. Named as cnnlab[...], pip takes them from the editable install's metadata
# and installs only what they add, without building cnnlab again.
$(VENV)/installed-test: $(VENV)/installed-run
	@echo "make: installing the $(TEST_EXTRAS) extras into $(VENV) (log: $(INSTALL_LOG))"
	@$(call logged,$(PIP_INSTALL) 'cnnlab[$(TEST_EXTRAS)]')
	@$(call logged,$(COMPILE) $(SITE_PACKAGES))
	@touch $@

setup: $(VENV)/installed-run

run: $(VENV)/installed-run
	$(BIN)/python -m cnnlab cpu

lint: $(VENV)/installed-test
	$(BIN)/ruff check .

# mypy, as pyproject.toml configures it: the whole package, the public API as --strict checks it.
typecheck: $(VENV)/installed-test
	$(BIN)/mypy

# On every core (pytest-xdist), the GPU's users one at a time (tests/conftest.py: they hold a lock): measured on the
# 2-core machine, the suite takes half the time it does on one.
test: lint typecheck
	$(BIN)/python -m pytest -q -rs -n auto $(PYTEST_ARGS)  # -rs: the reason for every skip

# The sdist, as `python -m build` in the root makes it (build.py hands over to pypa's build), installed with the test
# extra into a fresh venv on each other Python, run in cpu mode and tested there (tools/test-sdist.sh).
test-pythons: $(VENV)/installed-test
	@rm -rf dist
	@$(call logged,$(BIN)/python -m build --sdist --no-isolation --outdir dist)
	@own=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	for version in $(PYTHONS); do \
		[ "$$version" = "$$own" ] || tools/test-sdist.sh "$$version" dist/cnnlab-*.tar.gz $(PYTHONS_ARGS) || exit 1; \
	done

clean:
	rm -rf $(VENV) out build dist *.egg-info
