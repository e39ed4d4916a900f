# Build: docker build -t courier .   Run as a sidecar with the config mounted at /etc/courier/courier.yaml.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/courier /usr/local/bin/courier
USER 65532:65532
ENV COURIER_CONFIG=/etc/courier/courier.yaml
ENTRYPOINT ["/usr/local/bin/courier"]
CMD ["run"]
