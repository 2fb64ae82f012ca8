# syntax=docker/dockerfile:1
# vmpool's one image: the API, the workers, the scheduler, the audit and rq-dashboard
# (deploy/k8s runs each with its own arguments). Build: docker build -t vmpool:0.1.0 .
#
# builder: builds vmpool's wheel and the wheels of everything it needs at run time
# (the `dashboard` extra; not `embedded`: in a cluster Redis runs in its own pod).
# final: a slim Python with those wheels installed in a venv, no compiler, no pip,
# no source tree, run as an unprivileged user.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY vmpool ./vmpool
COPY workers ./workers
# vmpool's wheel and, beside it, a wheel of every runtime dependency, so that the final
# stage installs offline from this directory and builds nothing.
RUN pip wheel --wheel-dir /wheels ".[dashboard,ldap]"

FROM ${PYTHON_IMAGE} AS final
LABEL org.opencontainers.image.title="vmpool" \
      org.opencontainers.image.description="vmpooler-compatible on-demand VM pool manager" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/vmpool/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheels are mounted from the builder for this one step, never copied into a layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m venv /opt/vmpool \
    && /opt/vmpool/bin/pip install --no-index --find-links=/wheels "vmpool[dashboard,ldap]" \
    && /opt/vmpool/bin/pip uninstall --yes pip \
    && python -m pip uninstall --yes setuptools wheel pip \
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
