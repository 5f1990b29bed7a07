# subagentd container image.
#
#   docker build -t subagentd:0.1.0 .
#   docker run --rm -p 50051:50051 -p 9464:9464 \
#     -v subagentd-data:/var/lib/subagentd subagentd:0.1.0
#
# Durable state (the embedded store, [store] in deploy/config/container.toml)
# lives in the volume /var/lib/subagentd: give it a named volume (as above) or
# a PersistentVolumeClaim, or it is lost with the container.
#
# The build step is the one CI runs (`cargo build --release --locked`), so
# what CI proves is what the image contains. Checked by `bash .ci/deploy-checks.sh`
# (hadolint); the Helm chart that runs it is helm/subagentd.

# ---------------------------------------------------------------------------
# Builder: the Rust toolchain, pinned by tag.
# ---------------------------------------------------------------------------
FROM rust:1.95-bookworm AS builder
WORKDIR /src

# 1. Dependencies only, in their own layer, rebuilt only when the manifest,
#    the lock file, the build script or the protos change. Cargo must be able
#    to parse the manifest, so every declared target gets a stub: the library
#    (src/lib.rs), the two [[bin]]s (src/main.rs, src/bin/subagentd-bench/main.rs)
#    and the [[bench]] (benches/scheduler.rs, not built here). build.rs is the
#    real one: it compiles proto/ (and proto-vendor/ for reflection) with protox.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto/ proto/
COPY proto-vendor/ proto-vendor/
RUN mkdir -p src/bin/subagentd-bench benches \
    && echo 'fn main() {}' > src/main.rs \
    && echo 'fn main() {}' > src/bin/subagentd-bench/main.rs \
    && echo 'fn main() {}' > benches/scheduler.rs \
    && touch src/lib.rs \
    && cargo build --release --locked

# 2. The real sources. COPY keeps the files' own modification times, which may
#    be older than the stubs built above; touching each target's root file makes
#    cargo rebuild this crate (and only this crate) instead of reusing the stubs.
COPY src/ src/
COPY benches/ benches/
RUN touch src/lib.rs src/main.rs src/bin/subagentd-bench/main.rs \
    && cargo build --release --locked \
    && install -D -m 0755 target/release/subagentd /out/subagentd

# ---------------------------------------------------------------------------
# Runtime: Debian slim, because `command` runners start programs that expect a
# shell and coreutils. No packages are added.
# ---------------------------------------------------------------------------
FROM debian:bookworm-slim

LABEL org.opencontainers.image.title="subagentd" \
      org.opencontainers.image.description="A gRPC service that schedules, runs and supervises sub-agents" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"

# A fixed numeric non-root user (Kubernetes' runAsNonRoot can only verify a
# numeric USER). Its home is /tmp, writable scratch space when the root
# filesystem is read-only (the Helm chart mounts an emptyDir there). The
# embedded store's data directory /var/lib/subagentd belongs to it, mode 0700:
# a volume mounted there starts with this owner (Docker copies it into a new
# named volume; the Helm chart sets fsGroup 10001 for a PersistentVolumeClaim).
RUN groupadd --system --gid 10001 subagentd \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
       --shell /usr/sbin/nologin subagentd \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/subagentd

# CA roots for programs that command runners start (the server itself carries
# its own roots for the openai runner). Copied instead of installed, so the
# stage needs no package manager run.
COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=builder /out/subagentd /usr/local/bin/subagentd
COPY deploy/config/container.toml /etc/subagentd/config.toml

# Declared after the directory is made and owned, so a new volume starts with
# its owner and mode. Only one server may open the store at a time (a file lock).
VOLUME ["/var/lib/subagentd"]

USER 10001:10001
# Runs without `cwd` start here; /tmp is writable.
WORKDIR /tmp

# gRPC API (with grpc.health.v1 and reflection), Prometheus /metrics.
EXPOSE 50051 9464 50080

# SIGTERM starts the graceful drain ([server] shutdown_grace); a second
# SIGTERM or SIGINT exits at once.
STOPSIGNAL SIGTERM
ENTRYPOINT ["subagentd"]
CMD ["serve", "--config", "/etc/subagentd/config.toml"]
