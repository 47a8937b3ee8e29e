# One image for the check/get/put services (CMD: serve ACTION) and for the stage/collect
# steps of task pods (command: python -m functions stage|collect …).
#
# BASE: any Debian-based image with python3 (3.11+) and its venv module. The default is the
# official slim image; tests/support/project_image.py builds FROM a locally made Debian base instead
# (python3 + python3-venv from debootstrap), as its machine reaches no registry. The venv is
# copied between two stages of the SAME base, so its interpreter link stays valid.
ARG BASE=docker.io/library/python:3.11-slim-bookworm
# rf-agent (agent/): the static program of warm check pods, built with Go. A build without a
# registry gives the binary instead: --build-context agent=<a folder holding rf-agent>
# (tests/support/project_image.py builds it with agent/build.sh).
ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm

FROM ${GO_IMAGE} AS agent
COPY agent /src
RUN cd /src && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /rf-agent .

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.txt constraints.txt /tmp/
# Wheels only: no compiler is needed here, and none can end up in the image. pip and
# setuptools go once the dependencies are in: the running services install nothing. So does
# the kubernetes client's asyncio twin (kubernetes/aio, 68 MB: a quarter of the venv), which
# nothing imports. The import check proves that every requirement still imports without them.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --only-binary=:all: -r /tmp/requirements.txt -c /tmp/constraints.txt \
 && /opt/venv/bin/pip uninstall --yes pip setuptools \
 && rm -rf /opt/venv/lib/python3*/site-packages/kubernetes/aio \
 && /opt/venv/bin/python -c "import ahocorasick_rs, boto3, cloudevents.core.bindings.http, docker, flask, gunicorn.app.base, \
      google.cloud.storage, kubernetes.client, kubernetes.config, kubernetes.watch, \
      prometheus_client, requests, zstandard" \
 && chmod -R a+rX,go-w /opt/venv
COPY functions /app/functions
COPY storage /app/storage
# Byte-code compiled once here: the root filesystem is read-only at run time, and each task
# pod starts the interpreter twice. unchecked-hash: valid whatever mtimes COPY gives the files.
RUN python3 -m compileall -q --invalidation-mode unchecked-hash /app \
 && chmod -R a+rX,go-w /app

FROM ${BASE}
# catatonit and rf-agent: the static programs a warm check pod's init container copies for the
# resource container to run (docs/warm-checks.md).
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends catatonit >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && test -x /usr/bin/catatonit
RUN groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin nonroot
COPY --from=agent /rf-agent /usr/bin/rf-agent
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/app PATH=/opt/venv/bin:$PATH
WORKDIR /app
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["python", "-m", "functions"]
CMD ["serve", "check"]
