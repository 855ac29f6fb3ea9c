# syntax=docker/dockerfile:1
# The `perennial` binary in a distroless image: the operator (`perennial operator`), the init
# containers of worker pods (`perennial fetch`) and the edge agent (`perennial edge`).
#   docker build -t ghcr.io/perennial-edge/perennial:0.1.0 .

FROM rust:1.95-bookworm AS builder
# The built-in policies are WebAssembly components that runtime/policy/build.rs compiles and embeds.
RUN rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
# The cache mounts keep the crates and the build between builds: a change rebuilds only what it
# touches. The target folder is a cache mount, so the binary is copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release -p perennial --locked \
    && cp target/release/perennial /usr/local/bin/perennial

# glibc and libgcc, which the binary links; built on bookworm, so the same glibc.
FROM gcr.io/distroless/cc-debian12:nonroot
# On PATH: worker pods' init containers run `perennial fetch` by name.
COPY --from=builder /usr/local/bin/perennial /usr/local/bin/perennial
# distroless's `nonroot` user, by number: the kubelet can only check runAsNonRoot against a
# numeric user.
USER 65532:65532
ENTRYPOINT ["perennial"]
