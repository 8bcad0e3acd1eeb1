# kproxy container image: Debian 12's own python3 and a virtualenv under /opt/kproxy with
# the runtime dependencies only (no test tools, no pyspark).
#
# The base, debian:bookworm-slim, can be made offline from Debian's packages when no
# registry is reachable (`make image` does it with debootstrap). Package indexes are
# reached with what the builder lends the RUN steps (apt sources as read-only volumes,
# pip configuration and CA bundle as build secrets); nothing of it lands in a layer.
FROM debian:bookworm-slim AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/kproxy
WORKDIR /src
# .dockerignore lets in only pyproject.toml, README.md and the four package folders.
COPY . ./
# The builder may pass its pip configuration and CA bundle as build secrets (make image
# does); they are mounted for this step only and never stored in a layer.
RUN --mount=type=secret,id=kproxy-pip --mount=type=secret,id=kproxy-ca \
    PIP_CONFIG_FILE=/run/secrets/kproxy-pip /opt/kproxy/bin/pip install --no-cache-dir \
      --no-compile . \
 && /opt/kproxy/bin/pip uninstall -y -q pip setuptools \
 && /opt/kproxy/bin/python3 -m compileall -q /opt/kproxy/lib

FROM debian:bookworm-slim
# python3 only (no venv module, no pip): the virtualenv's interpreter is this one.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kproxy
# Everything that does not depend on the code comes before it, so that a code change
# rebuilds only the layers below (each layer is a full copy with buildah's vfs driver).
ENV PATH=/opt/kproxy/bin:$PATH \
    KPROXY_LISTEN=0.0.0.0:9092 \
    KPROXY_HTTP=0.0.0.0:9080 \
    KPROXY_LOG_FORMAT=json
# Inside a container kproxy listens on every interface; set KPROXY_ADVERTISED_HOST to the
# name clients use, and KPROXY_UPSTREAM to the backend's bootstrap servers.
# 9092: bootstrap; 9093+: one port per broker (base + node id - first); 9080: HTTP.
EXPOSE 9092 9093 9080
# The probe reads the HTTP port from KPROXY_HTTP, so it follows a changed port.
HEALTHCHECK --interval=10s --timeout=3s CMD ["python3", "-c", "import os, urllib.request; port = os.environ.get('KPROXY_HTTP', ':9080').rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2)"]
ENTRYPOINT ["kproxy", "run"]
USER 10001
COPY --from=build /opt/kproxy /opt/kproxy
