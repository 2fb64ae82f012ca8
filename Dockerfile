# syntax=docker/dockerfile:1
# vmpool's one image: the API, the workers, the scheduler, the audit and rq-dashboard
# (deploy/k8s runs each with its own arguments), with every provider: the clouds (the
# `cloud` extra: EC2, GCE, OpenStack), vSphere (the `vsphere` extra), rq-dashboard
# (`dashboard`) and LDAP logins (`ldap`); not `embedded`: in a cluster Redis runs in its
# own pod.
# Build: docker build -t vmpool:0.1.0 .
#
# Reproducible: the dependencies come from requirements/image.lock (every version
# pinned, every file's sha256; `make lock` rewrites it from pyproject.toml), installed
# with --require-hashes; vmpool itself is then installed with --no-index, so a
# dependency the lock lacks fails the build instead of being resolved anew. Pin the
# base image by digest for the same reason (docs/operations.md, "Build the image"):
#   docker build --build-arg PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:<digest> .
#
# builder: makes the venv /opt/vmpool (compilers and pip stay here).
# final: a slim Python with that venv copied in, no pip, no source tree, run as an
# unprivileged user.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ARG VMPOOL_EXTRAS=cloud,vsphere,dashboard,ldap
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The locked dependencies first: this layer is rebuilt only when the lock changes.
COPY requirements/image.lock ./requirements/image.lock
RUN python -m venv /opt/vmpool \
    && /opt/vmpool/bin/pip install --require-hashes --no-deps -r requirements/image.lock
COPY pyproject.toml README.md ./
COPY vmpool ./vmpool
COPY workers ./workers
# vmpool's wheel, then vmpool with its extras from nothing but that wheel and what the
# lock installed (--no-index): pip fails here if the lock misses a requirement.
RUN /opt/vmpool/bin/pip wheel --no-deps --wheel-dir /tmp/dist . \
    && /opt/vmpool/bin/pip install --no-index --find-links=/tmp/dist "vmpool[${VMPOOL_EXTRAS}]" \
    && /opt/vmpool/bin/pip check \
    && /opt/vmpool/bin/pip uninstall --yes pip setuptools wheel

FROM ${PYTHON_IMAGE} AS final
LABEL org.opencontainers.image.title="vmpool" \
      org.opencontainers.image.description="vmpooler-compatible on-demand VM pool manager" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/vmpool/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
# The same base image in both stages: the venv's interpreter path is the same.
COPY --from=builder /opt/vmpool /opt/vmpool
RUN python -m pip uninstall --yes setuptools wheel pip \
    && groupadd --system --gid 10001 vmpool \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
       --shell /usr/sbin/nologin vmpool
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /tmp
# 8080: `vmpool api`; 9181: rq-dashboard.
EXPOSE 8080 9181
ENTRYPOINT ["vmpool"]
CMD ["--help"]
