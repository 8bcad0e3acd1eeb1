# kproxy container image: runtime dependencies only (no test tools, no pyspark).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY codecs ./codecs
COPY policies ./policies
COPY pipeline ./pipeline
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home kproxy
COPY --from=build /install /usr/local
USER 10001
# Inside a container, listen on every interface; set KPROXY_ADVERTISED_HOST to the name
# clients use, and KPROXY_UPSTREAM to the backend's bootstrap servers.
ENV KPROXY_LISTEN=0.0.0.0:9092 \
    KPROXY_HTTP=0.0.0.0:9080 \
    KPROXY_LOG_FORMAT=json
# 9092: bootstrap; 9093+: one port per broker (base + node id - first); 9080: HTTP.
EXPOSE 9092 9093 9080
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9080/healthz', timeout=2)"
ENTRYPOINT ["kproxy", "run"]
