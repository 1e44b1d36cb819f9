# The noops operator image: a static-ish release build on a distroless base, running as a
# non-root user. (The local Kubernetes maps this image to the cargo build instead; see
# cluster/images.yaml.)
FROM rust:1.95-bookworm AS build
# What cargo needs beyond Rust: the same packages as `make setup` (cargo_build_packages in
# hack/setup.sh; a test compares the two lists).
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p noops

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/noops /usr/local/bin/noops
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/noops"]
CMD ["run", "--http-addr=0.0.0.0:8080", "--log-format=json"]
