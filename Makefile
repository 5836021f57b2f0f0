# Two commands do everything (see README):  make lab   and   make test
# Both create .venv/ on first use and reuse it afterwards; re-running is cheap.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch that this project's own machines install. Elsewhere pip takes whatever
# build of this version suits the platform; override with  make TORCH='torch==X.Y'  if needed.
TORCH ?= torch==2.13.0

.PHONY: lab lab-smoke test lint setup clean

# Installs again only when pyproject.toml changes. Grading sandboxes student code with
# bubblewrap (Linux only): installed here when we may (root with apt-get), else a note.
$(VENV)/.installed: pyproject.toml
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "note: bubblewrap (bwrap) is not installed; grading needs it" \
	    "(Debian/Ubuntu: sudo apt-get install bubblewrap)"; fi; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet '$(TORCH)'
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

setup: $(VENV)/.installed

lab: $(VENV)/.installed
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m grader lab

lab-smoke: $(VENV)/.installed
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m grader lab --smoke --workspace build/smoke-workspace

test: $(VENV)/.installed
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n 2 --dist loadgroup

lint: $(VENV)/.installed
	$(BIN)/ruff check .

clean:
	rm -rf .course build workspace/.ipynb_checkpoints
