# slotpool: build stage compiles the release binary; the runtime stage is Debian slim
# with the binary, tini as PID 1 (forwards SIGTERM so workers release their slots),
# and a non-root user.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY schemas ./schemas
RUN cargo build --release --locked --bin slotpool

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home slotpool
COPY --from=build /src/target/release/slotpool /usr/local/bin/slotpool
COPY examples/robots /opt/robots
USER 10001
EXPOSE 7700
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/slotpool"]
CMD ["worker"]
