# syntax=docker/dockerfile:1
# patchbay-gateway: OpenAI Realtime gateway.
#
# Build from the repository root (the workspace is the build context):
#   docker build -f docker/gateway.Dockerfile -t patchbay/gateway:0.1.0 .
#   docker build -f docker/gateway.Dockerfile --build-arg PGO=0 -t patchbay/gateway:dev .
#
# The builder and the runtime share Debian 12, so the binary's glibc matches.
# TLS is rustls with ring and the CA roots are compiled in, so the runtime
# needs neither OpenSSL nor a CA bundle: distroless "cc" (glibc, libgcc) is
# enough, with no shell or package manager.
#
# PGO=1 (the default) builds the gateway profile-guided with
# benchmarks/pgo.sh: an instrumented build, a training run against the
# gateway's own simulator on the build container's loopback (no network
# beyond the crates), and the optimized build. It takes about three times as
# long as a plain build and costs ~11 % less CPU per session (the CPU stage
# in benchmarks/README.md). `--build-arg PGO=0` builds plain.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
ARG PGO=1
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target directory between builds; the
# binary is copied out because the cache mount is not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    if [ "$PGO" = 1 ]; then \
      rustup component add llvm-tools \
      && benchmarks/pgo.sh \
      && install -D -m 0755 target/pgo/release/patchbay-gateway /out/patchbay-gateway; \
    else \
      cargo build --release --locked -p patchbay-gateway \
      && install -D -m 0755 target/release/patchbay-gateway /out/patchbay-gateway; \
    fi

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/patchbay-gateway /usr/local/bin/patchbay-gateway
USER 65532:65532
# 8080: clients (WebSocket). 9090: admin (/metrics, /healthz, /readyz).
# The gateway's own defaults listen on 127.0.0.1, which a container's published
# port (`docker run -p 8080:8080`) cannot reach; in the image both listeners
# take every interface. These are the gateway's env overrides, so they beat a
# mounted config file's [server] listen and admin_listen: set the variables to
# move them. The operator's pods render the same addresses in gateway.toml.
ENV PATCHBAY_SERVER_LISTEN=0.0.0.0:8080 \
    PATCHBAY_SERVER_ADMIN_LISTEN=0.0.0.0:9090
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/patchbay-gateway"]
CMD ["serve"]
