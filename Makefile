# slurm-burst: `make demo` and `make test` each set up everything they need
# (Debian packages, a .venv in the repo root) and are safe to run again.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SB := $(VENV)/bin/slurm-burst
LAB_CONFIG := slurm-conf/lab/slurm-burst.toml
LAB_SLURM_CONF := /var/lib/slurm-burst-lab/etc/slurm/slurm.conf

.PHONY: help setup system venv demo test test-fast bench soak lab-up lab-down lint docs clean

help:
	@echo "make demo      set up, bring the lab up, run a 2-node job on burst cloud nodes"
	@echo "make test      set up and run the whole test suite (root: the lab tests need it)"
	@echo "make test-fast the unit tests alone (seconds, any user)"
	@echo "make bench     set up and print the benchmark figures"
	@echo "make soak      200 burst cycles in the lab, then nothing left and nothing grown"
	@echo "make lab-down  remove the lab: processes, namespaces, links, files"
	@echo "make lint      ruff and mypy (strict: package, tests, benchmarks)"
	@echo "make docs      regenerate the generated sections of docs/"

setup: system venv

system:
	@scripts/setup-system.sh

# Re-install when packaging metadata changes; the stamp lives inside the venv.
$(VENV)/.installed: setup.cfg pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

venv: $(VENV)/.installed

demo: setup
	scripts/demo.sh

lab-up: setup
	$(SB) --config $(LAB_CONFIG) lab up

lab-down: venv
	$(SB) --config $(LAB_CONFIG) lab down --yes

# pytest exits 5 when it collected nothing (e.g. a -m selection with no tests): say so.
test: setup
	@set +e; $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest: no tests were collected"; exit 1; fi; exit $$rc

# The unit tier alone: pure, in-memory, seconds, no root.
test-fast: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/run.py

# The soak (tests/lab/test_z_soak.py); CI runs it with 20 cycles inside `make test`.
SOAK_CYCLES ?= 200
soak: setup
	SOAK_CYCLES=$(SOAK_CYCLES) $(PY) -m pytest tests/lab/test_z_soak.py -p no:cacheprovider \
		-o timeout=5400 -rs $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check slurm_burst tests benchmarks scripts
	$(VENV)/bin/mypy slurm_burst tests benchmarks scripts/docs.py

docs: venv
	$(PY) scripts/docs.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
