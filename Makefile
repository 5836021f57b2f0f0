# Two commands do everything (see README):  make lab   and   make test
# Both create .venv/ on first use and reuse it afterwards; re-running is cheap.

PYTHON ?= python3
, := ,# a comma, written $(,) inside a $(call ...) argument
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch that this project's own machines install. Elsewhere pip takes whatever
# build of this version suits the platform; override with  make TORCH='torch==X.Y'  if needed.
TORCH ?= torch==2.13.0
# JupyterHub's proxy (npm), for tests/test_hub.py: installed in .venv/node/, not system-wide.
CHP_VERSION ?= 5.3.0
# The hub test's single-user servers' environment, as root (see $(HUB_STAMP) below).
HUB_PYTHON ?= /usr/bin/python3
HUB_PINNED := jupyterhub|jupyterlab|jupyter_server|nbgrader|ipykernel|ipywidgets|notebook
HUB_STAMP := $(VENV)/.hub-installed

.PHONY: lab lab-smoke demo test test-quick lint setup clean labextension

# Each install step runs again only when pyproject.toml changes. Three steps, each on top of
# the one before: a student's lab (the lessons, JupyterLab, nbgrader: pyproject.toml's
# dependencies, nothing else), an instructor's grading (`make setup`: the `grade` group, and
# bubblewrap, which sandboxes student code, Linux only), the test suite (`make test`: the `dev`
# group, Debian's chromium for the browser tests, PostgreSQL and Redis servers for the tests of
# grading on several machines). System packages are installed where we may (root with apt-get),
# else a note says what is missing (the tests that need them are then skipped).
GRADE_STAMP := $(VENV)/.grade-installed
DEV_STAMP := $(VENV)/.dev-installed
apt_install = if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null; \
	  else echo "note: $(2) (Debian/Ubuntu: sudo apt-get install $(1))"; fi

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet '$(TORCH)' && $(BIN)/python -m pip install --quiet -e .
	@touch $@

$(GRADE_STAMP): $(VENV)/.installed
	@command -v bwrap >/dev/null || { $(call apt_install,bubblewrap,grading sandboxes student \
	  code with bubblewrap); }
	$(BIN)/python -m pip install --quiet -e '.[grade]'
	@touch $@

$(DEV_STAMP): $(GRADE_STAMP)
	@if ! command -v chromium >/dev/null || ! command -v redis-server >/dev/null \
	    || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  $(call apt_install,chromium postgresql redis-server,the browser tests need chromium$(,) \
	    the tests of grading on several machines postgresql and redis-server); fi
	$(BIN)/python -m pip install --quiet -e '.[grade,dev]'
	@touch $@

# What only tests/test_hub.py needs, so only `make test` builds it (not `make setup` or `make
# lab`): JupyterHub's proxy (npm's configurable-http-proxy, in .venv/node/), and as root
# .venv/hub/, the course's environment again (this package, [hub]; the browser-facing packages
# at .venv's versions) on the system's Python, for the test's single-user servers, which run as
# other users who may not be allowed to run .venv's Python (pyenv's under /root is not).
$(HUB_STAMP): $(DEV_STAMP)
	@if command -v npm >/dev/null; then \
	  npm install --silent --no-fund --no-audit --prefix $(VENV)/node \
	    configurable-http-proxy@$(CHP_VERSION) >/dev/null; \
	else echo "note: the JupyterHub test needs npm's configurable-http-proxy (install" \
	  "Node.js and npm)"; fi
	@if [ "$$(id -u)" = 0 ] && [ -x "$(HUB_PYTHON)" ]; then \
	  { test -x $(VENV)/hub/bin/python || $(HUB_PYTHON) -m venv $(VENV)/hub; } \
	  && $(VENV)/hub/bin/python -m pip install --quiet '$(TORCH)' \
	  && $(BIN)/python -m pip freeze | grep -iE '^($(HUB_PINNED))==' > $(VENV)/hub-pins.txt \
	  && $(VENV)/hub/bin/python -m pip install --quiet -c $(VENV)/hub-pins.txt -e '.[hub]' \
	  || echo "note: no environment for the JupyterHub test's single-user servers"; fi
	@touch $@

setup: $(GRADE_STAMP)

lab: $(VENV)/.installed
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m grader lab $(if $(STUDENT),--student '$(STUDENT)') $(if $(CODE),--code '$(CODE)')

lab-smoke: $(VENV)/.installed
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m grader lab --smoke --workspace build/smoke-workspace

# make demo LESSON=03_matmul_flops: the instructor version, solutions filled in, for class.
demo: $(VENV)/.installed
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m grader demo $(LESSON)

test: $(DEV_STAMP) $(HUB_STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n 2 --dist loadgroup --durations=30

# The authors' inner loop, not CI's: the tests not marked slow (reference code against its
# oracles, unit and property tests, the docs, the layers), without grading, notebooks run end
# to end, browsers or servers. CI runs `make test`, the README's command.
test-quick: $(DEV_STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n 2 --dist loadgroup -m "not slow" --durations=10

# The course's Validate button (grader/lab/labextension/): its build is committed, so that students
# need no Node.js; after changing index.js or style/, rebuild it here (needs npm) and commit.
LABEXT := grader/lab/labextension
labextension: $(VENV)/.installed
	cd $(LABEXT) && npm ci --silent --no-fund --no-audit
	rm -rf $(LABEXT)/share
	cd $(LABEXT) && node node_modules/@jupyterlab/builder/lib/build-labextension.js \
	  --core-path "$$($(CURDIR)/$(BIN)/python -c 'import jupyterlab, os; \
	    print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')" . >/dev/null
	$(BIN)/python -c 'from grader.lab.server import button_sources; print(button_sources())' \
	  > $(LABEXT)/built-from.txt

lint: $(DEV_STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf .course build workspace/.ipynb_checkpoints
