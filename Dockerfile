# retryproxy image (a sidecar by default, standalone with -c /etc/retryproxy/standalone.json):
# build on Debian 12, run on Debian 12 slim with only the runtime libraries, as an unprivileged
# user.
FROM debian:12 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential pkg-config \
      libmicrohttpd-dev libcurl4-openssl-dev libjansson-dev libnghttp2-dev libssl-dev libc-ares-dev \
      libsqlite3-dev libpq-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile ./
COPY policy policy
COPY config config
COPY proxy proxy
# The image needs only the binary, whose target asks for the build libraries only (the test
# dependencies come with make test).
RUN make build/retryproxy WERROR=1

FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libmicrohttpd12 libcurl4 libjansson4 libnghttp2-14 libssl3 libc-ares2 \
      libsqlite3-0 libpq5 \
      ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home retryproxy
COPY --from=build /src/build/retryproxy /usr/local/bin/retryproxy
# Two configs (docs/deploy.md, "Container image"): the default, for a sidecar, on 127.0.0.1;
# standalone.json on every address, for `docker run -p` (pass -c /etc/retryproxy/standalone.json).
COPY deploy/config.json /etc/retryproxy/config.json
COPY deploy/standalone.json /etc/retryproxy/standalone.json
USER 10001
EXPOSE 15001 15000
ENTRYPOINT ["/usr/local/bin/retryproxy"]
CMD ["-c", "/etc/retryproxy/config.json"]
