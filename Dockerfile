# syntax=docker/dockerfile:1
# One image for both parts of tinct: `tinct operator` and `tinct router` (the chart runs
# it with either subcommand); `tinct emulator` serves an emulated LLM engine from it too. Build: docker build -t tinct:0.1.0 .
# Any base with python3 and its venv module works, e.g. one made of Debian packages:
#   --build-arg PYTHON_IMAGE=localhost/debian-python3:bookworm
# (the end-to-end tests build such a base with debootstrap: tests/support/tinct_testing/controlplane/images.py).
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

# --- build: a wheel of tinct, installed with its dependencies into a virtualenv --------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# pip lives in a throwaway virtualenv of this stage; the runtime one is created without it.
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && python3 -m venv --without-pip /opt/tinct \
 && /opt/build/bin/pip --python /opt/tinct/bin/python install "$(ls /wheels/tinct-*.whl)[fast]" \
 && /opt/tinct/bin/tinct --version

# --- runtime: the interpreter and the virtualenv; no pip, no wheel, no compiler ---------
FROM ${PYTHON_IMAGE}
RUN if python3 -m pip --version >/dev/null 2>&1; then \
      python3 -m pip uninstall --yes --root-user-action=ignore pip setuptools wheel; \
    fi \
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
