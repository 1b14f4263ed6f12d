# `make demo` and `make test` each create .venv if missing and install the pinned dependencies:
# the demo only the sidecar's (extra `sidecar`), the tests also the `dev` and `frameworks` extras.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SIDECAR_STAMP := $(VENV)/.installed-sidecar

.PHONY: install demo test bench clean

$(SIDECAR_STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[sidecar]'
	touch $(SIDECAR_STAMP)

$(STAMP): $(SIDECAR_STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[sidecar,dev,frameworks]'
	touch $(STAMP)

install: $(STAMP)

demo: $(SIDECAR_STAMP)
	$(VENV)/bin/relyscope demo

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .relyscope
