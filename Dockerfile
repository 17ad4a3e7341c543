# syntax=docker/dockerfile:1
# One image for both parts of tinct: `tinct operator` and `tinct router` (the chart runs
# it with either subcommand). Build: docker build -t tinct:0.1.0 .
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

# --- build: a wheel of tinct, installed with its dependencies into a virtualenv --------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/tinct \
 && python -m pip --python /opt/tinct/bin/python install "$(ls /wheels/tinct-*.whl)[fast]" \
 && /opt/tinct/bin/tinct --version

# --- runtime: the interpreter and the virtualenv; no pip, no wheel, no compiler ---------
FROM ${PYTHON_IMAGE}
RUN python -m pip uninstall --yes --root-user-action=ignore pip setuptools wheel \
 && groupadd --system --gid 10001 tinct \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin tinct
COPY --from=build /opt/tinct /opt/tinct
ENV PATH=/opt/tinct/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric, so that runAsNonRoot can verify it without resolving names.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["tinct"]
CMD ["--help"]
