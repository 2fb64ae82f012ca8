# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: venv test lint unit demo clean

# The editable install's one notice ("Editable installation ...") is setuptools' standing
# advice, not about this project: filtered by its text, every other warning still shows.
$(VENV)/.installed: pyproject.toml
	@echo "installing vmpool and its dependencies into $(VENV) (a minute or two, once) ..."
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" \
	  $(PY) -m pip install -q -e '.[embedded,test,dashboard,ldap,vsphere]'
	@echo "installed: $(VENV)/bin/vmpool"
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check vmpool workers tests bench
	$(VENV)/bin/ruff format --check vmpool workers tests bench
	$(VENV)/bin/mypy

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
unit: venv
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

test: lint unit

demo: venv
	$(VENV)/bin/vmpool up --demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

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

# The image's locked dependencies (requirements/image.lock: pinned, with hashes), from
# pyproject.toml's dependencies and the extras the image installs (IMAGE_EXTRAS, the
# Dockerfile's VMPOOL_EXTRAS). pip-tools runs from a throwaway venv.
.PHONY: lock
IMAGE_EXTRAS ?= cloud vsphere dashboard ldap
LOCK_VENV ?= .venv-lock
lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q 'pip-tools==7.7.0'
	$(LOCK_VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe \
	  --no-emit-index-url --no-emit-find-links --no-emit-trusted-host \
	  $(foreach e,$(IMAGE_EXTRAS),--extra $(e)) \
	  --output-file requirements/image.lock pyproject.toml
