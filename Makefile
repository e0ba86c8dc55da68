# factstream developer entry points. Everything runs inside ./.venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
EXTRAS ?= dev,spark
PYTEST_ARGS ?=

.PHONY: venv install wheel demo test bench clean oracle prerequisites

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "factstream needs Python 3.11+ (set PYTHON=python3.11)"'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

venv: $(BIN)/python
	$(PIP) install --quiet "cython>=3.0.10" "setuptools>=77" wheel

# Compiled wheel (and a pure-Python fallback wheel) into wheels/.
wheel: venv
	rm -rf build/lib build/lib.* build/bdist.*   # never package a module that has moved away since the last build
	$(PIP) wheel --quiet --no-deps --no-build-isolation -w wheels .
	FACTSTREAM_NO_EXTENSIONS=1 $(PIP) wheel --quiet --no-deps --no-build-isolation -w wheels/pure .
	@ls -1 wheels/*.whl wheels/pure/*.whl

# Install the freshly built compiled wheel with the test extras, so tests run what ships.
install: wheel
	$(PIP) install --quiet --force-reinstall --no-deps "$$(ls -t wheels/factstream-*-cp*.whl | head -n 1)"
	$(PIP) install --quiet "$$(ls -t wheels/factstream-*-cp*.whl | head -n 1)[$(EXTRAS)]"

demo: install
	$(BIN)/factstream demo
	$(BIN)/factstream events-demo

test: install oracle prerequisites
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Every benchmark file (or only BENCH=wire, BENCH="wire heap", ...) against the installed
# wheel; one JSON per file in benchmarks/results/, then BENCHMARKS.md's tables are rewritten from them.
BENCH ?= $(patsubst benchmarks/bench_%.py,%,$(wildcard benchmarks/bench_*.py))
bench: install oracle
	@mkdir -p benchmarks/results
	@for name in $(BENCH); do \
	  echo "== make bench: $$name"; \
	  $(BIN)/python -m pytest benchmarks/bench_$$name.py -p no:randomly --benchmark-only \
	    --benchmark-group-by=group --benchmark-json=benchmarks/results/$$name.json $(PYTEST_ARGS) || exit 1; \
	done
	$(BIN)/python benchmarks/render.py

clean:
	rm -rf build wheels/*.whl wheels/pure .pytest_cache .benchmarks

# Synapse itself, as a test-only oracle for the codec's differential tests (never a dependency).
SYNAPSE_VERSION ?= 1.163.2
.venv-synapse/bin/python:
	$(PYTHON) -m venv .venv-synapse
	.venv-synapse/bin/python -m pip install --quiet "matrix-synapse==$(SYNAPSE_VERSION)"

oracle: .venv-synapse/bin/python
	.venv-synapse/bin/python -c 'import psycopg2, txredisapi, hiredis' 2>/dev/null || .venv-synapse/bin/python -m pip install --quiet psycopg2-binary 'txredisapi>=1.4.12,<1.6' hiredis

# Programs the tests start themselves (a private redis-server, a TLS certificate,
# redis-cli captures, Spark's JVM). Python needs come from the extras above;
# services (PostgreSQL, Redis) must already run. Missing programs are installed
# with apt-get when run as root on Debian/Ubuntu; otherwise the hint is printed,
# and under CI=true that is an error, since a test lacking them fails there.
PREREQUISITES ?= redis-server:redis-server redis-cli:redis-tools openssl:openssl java:openjdk-17-jre-headless nats-server:nats-server
prerequisites:
	@missing=""; for need in $(PREREQUISITES); do \
	  command -v "$${need%%:*}" >/dev/null 2>&1 || missing="$$missing $${need#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  else \
	    echo "the tests need:$$missing (apt-get install$$missing)" >&2; \
	    [ "$${CI:-}" != true ]; \
	  fi; \
	fi
