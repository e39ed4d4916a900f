# courier as a container image (README "Run in Kubernetes", deploy/).
#   docker build -t courier .
# The config is read from /etc/courier/courier.yaml (mount a ConfigMap there as
# a directory); relative journal and dead-letter paths resolve in
# /var/lib/courier (COURIER_STATE_DIR), which must be a writable volume.

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
# Stripped and without debuginfo here only: Cargo.toml keeps `debug = 1` so
# developers can profile release builds with perf.
ENV CARGO_PROFILE_RELEASE_DEBUG=0 \
    CARGO_PROFILE_RELEASE_STRIP=symbols
RUN cargo build --release --locked --bin courier \
    && install -D -m 0755 target/release/courier /out/courier \
    && install -d -m 0750 /out/state

# distroless: glibc, libgcc and CA certificates, no shell; nonroot = 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/courier /usr/local/bin/courier
# The runtime has no shell to mkdir/chown, so the state folder comes ready.
COPY --from=build --chown=65532:65532 /out/state /var/lib/courier
# SQLITE_TMPDIR: SQLite's temporary files go to the writable state volume,
# since Kubernetes runs the image with a read-only root filesystem.
ENV COURIER_CONFIG=/etc/courier/courier.yaml \
    COURIER_STATE_DIR=/var/lib/courier \
    SQLITE_TMPDIR=/var/lib/courier
USER 65532:65532
# 8080: ingress from the app (bind it to loopback); 9090: health, metrics, admin.
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/courier"]
CMD ["run"]
