# The image the Helm chart runs: build with the bundled librdkafka, run as a
# non-root user on a slim base with a read-only root filesystem.
#
# Two ways to build this same file (docs/helm.md, "Building the image"):
#   docker build -t orderpipe .      with a registry: both stages as written;
#   make image                       no daemon, no registry: dev/image.sh runs it with
#                                    buildah, the `build` stage replaced by the host's
#                                    release binary and debian:bookworm-slim by an
#                                    mmdebstrap bookworm rootfs. The runtime stage runs
#                                    unchanged, so keep it to one FROM debian:bookworm*
#                                    and one COPY --from=build (dev/image.sh checks).
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      cmake libcurl4-openssl-dev libssl-dev libsasl2-dev zlib1g-dev libzstd-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src src
COPY schemas schemas
COPY sql sql
# The production build: OTLP export in (--otlp-endpoint), no --features harness:
# the demo, bench-* commands, produce --count and the chaos handler stay out of
# the image (make test checks: dev/no-harness-check.sh, and tests/otlp.rs runs
# this binary's consume against a collector).
RUN cargo build --release --locked --features otlp --bin orderpipe

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 libsasl2-2 libzstd1 zlib1g \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin orderpipe
COPY --from=build /src/target/release/orderpipe /usr/local/bin/orderpipe
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/orderpipe", "--log-format", "json"]
