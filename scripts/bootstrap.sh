#!/usr/bin/env bash
# Install what tinct's tests, demo and local run need on a bare machine, idempotently:
#   - a virtualenv in .venv with tinct (editable) and the test support package tinct_testing
#     (editable, from tests/support), reinstalled only when either pyproject.toml changes;
#   - kube-apiserver, kube-controller-manager, kubectl and etcd, Prometheus, helm, kwok
#     and KEDA's operator and metrics API server, built from Go modules into
#     ~/.cache/tinct, each rebuilt only when what it is built from changes
#     (tests/support/tinct_testing/controlplane/build.py);
#   - a Java runtime for the Spark test when none is on PATH (apt-get, as root);
#   - the Debian packages of the end-to-end tier's node and images (runc, the CNI plugins,
#     iptables, conntrack, buildah, debootstrap), when missing (apt-get, as root).
#
# TINCT_BOOTSTRAP picks how much: `full` (the default: make test and the rest) installs all of
# the above with tinct's test and docs extras; `dev` (make dev) only the runtime with its
# `local` extra, and the control plane, Prometheus, kwok and KEDA; `demo` (make demo) the same
# without KEDA. No Java, no Debian packages, no pyspark, no helm for those two. A later `full`
# run adds what a `dev` or `demo` one left out.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
MODE=${TINCT_BOOTSTRAP:-full}
case "$MODE" in
  full) extras="test,fast,docs"; parts="" ;;
  dev) extras="local,fast"; parts="controlplane,prometheus,kwok,keda" ;;
  demo) extras="local,fast"; parts="controlplane,prometheus,kwok" ;;
  *) echo "TINCT_BOOTSTRAP=$MODE: give full, dev or demo" >&2; exit 2 ;;
esac

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "tinct needs Python >= 3.11 as \$PYTHON (now: $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

stamp="$VENV/.tinct-deps"
# tests/support holds tinct_testing, a distribution of its own: the harness and the helpers
# tests, scripts/ and bench/ import; never part of tinct's wheel or image.
# The stamp holds the hash of both pyproject.toml files, and " local" after it when only the
# runtime and its local extra are in: a full install serves every mode, a local one only dev
# and demo.
want=$(cat pyproject.toml tests/support/pyproject.toml | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" != "$want" ] && { [ "$MODE" = full ] || [ "$have" != "$want local" ]; }; then
  say "installing Python dependencies into $VENV (tinct[$extras])"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check uv
  "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" -e ".[$extras]" -e tests/support
  if [ "$MODE" = full ]; then echo "$want" > "$stamp"; else echo "$want local" > "$stamp"; fi
fi

# The Spark test reads the lineage tables with Delta's Spark connector, which needs a JVM.
if [ "$MODE" = full ] && ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing a Java runtime for the Spark test (openjdk-17-jre-headless)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "the Spark test needs Java >= 17 on PATH (e.g. apt-get install openjdk-17-jre-headless)" >&2
  fi
fi

# The e2e tier runs a real node (tests/support/tinct_testing/controlplane/node.py) and builds its images here.
node_packages="runc containernetworking-plugins iptables conntrack buildah debootstrap"
missing=""
for pkg in $node_packages; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing="$missing $pkg"
done
if [ "$MODE" = full ] && [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing the e2e tier's Debian packages:$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "the e2e tier needs root and the Debian packages:$missing" >&2
  fi
fi

if ! command -v go >/dev/null 2>&1; then
  echo "building the test control plane needs Go >= 1.26 on PATH (go.dev toolchain or the Go module proxy's)" >&2
  exit 1
fi
if [ -z "$parts" ]; then
  say "control plane, Prometheus, helm, kwok and KEDA binaries"
  "$VENV/bin/python" -m tinct_testing.controlplane.build
else
  say "binaries for make $MODE: ${parts//,/, }"
  "$VENV/bin/python" -m tinct_testing.controlplane.build --only "$parts"
fi
