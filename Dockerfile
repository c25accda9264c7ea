# syntax=docker/dockerfile:1
#
# kafka-cleaner: one image, two entry points.
#   kafka-cleaner sidecar --policy ... --log-dir ...   the sidecar (the operator injects it with
#                                                      command ["kafka-cleaner"])
#   kafka-cleaner-operator                             the operator (the Helm chart's Deployment
#                                                      sets command ["kafka-cleaner-operator"])
#
#   docker build -t ghcr.io/kafka-cleaner/kafka-cleaner:0.1.0 .
#
# The runtime stage holds the virtualenv and nothing else of ours, runs as the numeric non-root
# user 65532 (so that runAsNonRoot can verify it), and needs no shell: both entry points are
# exec-form console scripts. It works with readOnlyRootFilesystem: bytecode is compiled at
# build time and nothing is written outside the mounted volumes.
# (A distroless final stage, gcr.io/distroless/python3-debian12, would need the venv built
# against Debian's /usr/bin/python3.11 instead of this image's /usr/local one.)

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG RUST_IMAGE=rust:1-slim-bookworm

# The compiled core (native/, Rust) is built in the builder stage with the official Rust
# toolchain; the runtime stage gets the wheel's extension module and no compiler.
FROM ${RUST_IMAGE} AS rust

FROM ${PYTHON_IMAGE} AS builder
COPY --from=rust /usr/local/cargo /usr/local/cargo
COPY --from=rust /usr/local/rustup /usr/local/rustup
ENV CARGO_HOME=/usr/local/cargo \
    RUSTUP_HOME=/usr/local/rustup \
    PATH=/usr/local/cargo/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONSAFEPATH=1
# PYTHONSAFEPATH: the build runs Python in /src (PyO3's build script asks the interpreter for
# its configuration), where ./operator would shadow the standard library's operator module.
# Rust links the extension with the C toolchain's linker.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cleaner ./cleaner
COPY operator ./operator
COPY native ./native
# Build the wheel (compiling native/), then install it (with its dependencies, all binary
# wheels) into a venv. tests/test_image.py runs this last RUN line as it is (paths mapped), so
# keep it one plain sh line.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/kafka-cleaner \
 && /opt/kafka-cleaner/bin/pip install --only-binary=:all: /wheels/kafka_cleaner-*.whl \
 && /opt/kafka-cleaner/bin/python -m compileall -q /opt/kafka-cleaner/lib \
 && /opt/kafka-cleaner/bin/kafka-cleaner --help > /dev/null \
 && /opt/kafka-cleaner/bin/kafka-cleaner-operator --help > /dev/null

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kafka-cleaner" \
      org.opencontainers.image.description="Apache Kafka's log cleaner as a sidecar and a Kubernetes operator" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/kafka-cleaner/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONSAFEPATH=1
COPY --from=builder /opt/kafka-cleaner /opt/kafka-cleaner
USER 65532:65532
WORKDIR /
# 8080: the operator's /metrics, /healthz, /readyz; 9443: its webhook; 9410: the sidecar's HTTP.
EXPOSE 8080 9443 9410
ENTRYPOINT ["kafka-cleaner"]
CMD ["--help"]
