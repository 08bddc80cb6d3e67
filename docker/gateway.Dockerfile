# syntax=docker/dockerfile:1
# patchbay-gateway: OpenAI Realtime gateway.
#
# Build from the repository root (the workspace is the build context):
#   docker build -f docker/gateway.Dockerfile -t patchbay/gateway:0.1.0 .
#
# The builder and the runtime share Debian 12, so the binary's glibc matches.
# TLS is rustls with ring and the CA roots are compiled in, so the runtime
# needs neither OpenSSL nor a CA bundle: distroless "cc" (glibc, libgcc) is
# enough, with no shell or package manager.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target directory between builds; the
# binary is copied out because the cache mount is not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p patchbay-gateway \
 && install -D -m 0755 target/release/patchbay-gateway /out/patchbay-gateway

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/patchbay-gateway /usr/local/bin/patchbay-gateway
USER 65532:65532
# 8080: clients (WebSocket). 9090: admin (/metrics, /healthz, /readyz).
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/patchbay-gateway"]
CMD ["serve"]
