# syntax=docker/dockerfile:1
# patchbay-operator: RealtimeRoute operator.
#
# Build from the repository root (the workspace is the build context):
#   docker build -f docker/operator.Dockerfile -t patchbay/operator:0.1.0 .
#
# The builder and the runtime share Debian 12, so the binary's glibc matches.
# The operator talks only to the API server over rustls, trusting the CA from
# its ServiceAccount mount, so no OpenSSL is needed at runtime: distroless
# "cc" (glibc, libgcc) is enough, with no shell or package manager.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target directory between builds; the
# binary is copied out because the cache mount is not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p patchbay-operator \
 && install -D -m 0755 target/release/patchbay-operator /out/patchbay-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/patchbay-operator /usr/local/bin/patchbay-operator
USER 65532:65532
# 8080: /metrics and /healthz.
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/patchbay-operator"]
CMD ["run"]
