# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=
# make test's pytest-xdist workers, each a process with its own Redis (tests/conftest.py).
# More than the cores: most of a test's time is a process starting or a deadline poll
# waiting, not CPU. The chaos soaks run two at a time: each is a fleet of processes
# whose settle times are judged against bounds. 0 runs in one process.
WORKERS ?= 4
SOAK_WORKERS ?= 2

.PHONY: venv test lint unit soak-tests fast check demo clean distclean

# The venv is installed from requirements/dev.lock (every version pinned, with hashes: the
# same files on any machine and any day), then vmpool itself, editable, with no dependency
# resolution and no build isolation (its build backend, setuptools, is in the lock too).
# `pip check` proves the lock satisfies pyproject.toml. The editable install's one notice
# ("Editable installation ...") is setuptools' standing advice, filtered by its text.
$(VENV)/.installed: pyproject.toml requirements/dev.lock
	@echo "installing vmpool and its locked dependencies into $(VENV) (a minute or two, once) ..."
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes --no-deps -r requirements/dev.lock
	PYTHONWARNINGS="ignore:Editable installation" \
	  $(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	@echo "installed: $(VENV)/bin/vmpool"
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check vmpool workers tests bench
	$(VENV)/bin/ruff format --check vmpool workers tests bench
	$(VENV)/bin/mypy

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
define pytest
	$(PY) -m pytest $(1) $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc
endef

# The whole suite, in two steps: every test but the chaos soaks, then the soaks (each
# starts a fleet of processes under seeded faults for a minute or two), each on its
# workers; worksteal hands a finished worker the waiting tests of a busy one.
xdist = $(if $(filter-out 0,$(1)),-n $(1) --dist worksteal)
unit: venv
	$(call pytest,-m "not chaos" $(call xdist,$(WORKERS)))

soak-tests: venv
	$(call pytest,-m chaos $(call xdist,$(SOAK_WORKERS)))

test: lint unit soak-tests

# The fast loop: lint, types, and every test not marked slow (nor chaos), under two
# minutes on two cores. A test over the budget that is not marked slow fails it
# (tests/slowrule.py); the time taken is printed at the end.
fast: venv
	$(call pytest,-m "not slow and not chaos" --slow-strict -q)

check: venv
	@start=$$(date +%s%N); $(MAKE) --no-print-directory lint fast; rc=$$?; \
	  ms=$$(( ($$(date +%s%N) - start) / 1000000 )); \
	  echo "make check: $$(( ms / 1000 )).$$(( ms % 1000 / 100 )) s (the fast loop's goal: under 120 s)"; \
	  exit $$rc

demo: venv
	$(VENV)/bin/vmpool up --demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Also the machine's test build cache (the vCenter simulator: tests/vcsimhelp.py).
distclean: clean
	rm -rf "$${VMPOOL_TEST_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/vmpool-tests}"

# The chaos soak (tests/chaos/soak.py, docs/reliability.md): vmpool's fleet as real
# processes under seeded faults, checked at the end. TARGET=seed-reference runs the
# reference of the seed's design instead (it must report violations).
.PHONY: chaos
SECONDS ?= 60
SEED    ?= 1
TARGET  ?= vmpool
chaos: venv
	$(PY) tests/chaos/soak.py --seconds $(SECONDS) --seed $(SEED) --target $(TARGET) $(CHAOS_ARGS)

# Every benchmark in bench/, each table rewritten in docs/benchmarks.md (bench/run_all.py).
# BENCH=name[,name] runs only those. Minutes long; run it on an otherwise idle machine.
.PHONY: bench
BENCH ?=
bench: venv
	$(PY) bench/run_all.py $(if $(BENCH),--only $(BENCH))

# The locks (pinned, with hashes), from pyproject.toml; pip-tools runs from a throwaway venv.
# - requirements/dev.lock: the development and CI venv (`make venv`): vmpool's dependencies,
#   every extra `make venv` installs (DEV_EXTRAS), and requirements/tools.in (pip, setuptools).
# - requirements/image.lock: the container image (IMAGE_EXTRAS, the Dockerfile's
#   VMPOOL_EXTRAS), compiled with dev.lock as constraints, so the image runs the versions
#   the tests ran.
# A pin already in a lock is kept while pyproject.toml allows it; `make lock UPGRADE=1`
# takes the newest versions the index serves.
.PHONY: lock
DEV_EXTRAS   ?= embedded test dashboard ldap vsphere cloud
IMAGE_EXTRAS ?= cloud vsphere dashboard ldap
LOCK_VENV ?= .venv-lock
PIP_COMPILE = $(LOCK_VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe \
  --no-emit-index-url --no-emit-find-links --no-emit-trusted-host $(if $(UPGRADE),--upgrade)
lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q 'pip-tools==7.7.0'
	$(PIP_COMPILE) $(foreach e,$(DEV_EXTRAS),--extra $(e)) \
	  --output-file requirements/dev.lock pyproject.toml requirements/tools.in
	$(PIP_COMPILE) $(foreach e,$(IMAGE_EXTRAS),--extra $(e)) --constraint requirements/dev.lock \
	  --output-file requirements/image.lock pyproject.toml
