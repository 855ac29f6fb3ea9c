# syntax=docker/dockerfile:1
# The `perennial` binary in a distroless image: the operator (`perennial operator`), the init
# containers of worker pods (`perennial fetch`) and the edge agent (`perennial edge`). One image
# for amd64, arm64 and 32-bit ARM (v7), as a manifest list. The builder runs on the build
# machine's platform (amd64, as CI) and cross-compiles with Debian's gcc, as .ci/arm does: no
# emulation.
#   docker buildx build --platform linux/amd64,linux/arm64,linux/arm/v7 \
#       -t ghcr.io/perennial-edge/perennial:0.1.0 --push .

FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS builder
ARG TARGETARCH
# The built-in policies are WebAssembly components that runtime/policy/build.rs compiles and embeds.
RUN rustup target add wasm32-wasip2
# The image's platform as a Rust target, and Debian's cross gcc for it, which links it and builds
# the C inside (SQLite, ring): .cargo/config.toml names the linkers (docs/src/guides/edge-node.md, "ARM nodes").
RUN case "$TARGETARCH" in \
        amd64) echo x86_64-unknown-linux-gnu > /rust-target ;; \
        arm64) echo aarch64-unknown-linux-gnu > /rust-target \
            && apt-get update && apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross ;; \
        arm) echo armv7-unknown-linux-gnueabihf > /rust-target \
            && apt-get update && apt-get install -y --no-install-recommends gcc-arm-linux-gnueabihf libc6-dev-armhf-cross ;; \
        *) echo "no build for $TARGETARCH (amd64, arm64, arm)" >&2 && exit 1 ;; \
    esac \
    && rustup target add "$(cat /rust-target)"
WORKDIR /src
COPY . .
# The cache mounts keep the crates and the build between builds: a change rebuilds only what it
# touches. The target folder is a cache mount, so the binary is copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    target="$(cat /rust-target)" \
    && cargo build --release -p perennial --locked --target "$target" \
    && cp "target/$target/release/perennial" /usr/local/bin/perennial

# glibc and libgcc, which the binary links; built on bookworm (its cross libc6 for ARM), so the
# same glibc. The base image of the target platform.
FROM gcr.io/distroless/cc-debian12:nonroot
# On PATH: worker pods' init containers run `perennial fetch` by name.
COPY --from=builder /usr/local/bin/perennial /usr/local/bin/perennial
# distroless's `nonroot` user, by number: the kubelet can only check runAsNonRoot against a
# numeric user.
USER 65532:65532
ENTRYPOINT ["perennial"]
