#!/usr/bin/env bash
# Install everything tinct's tests and demo need on a bare machine, idempotently:
#   - a virtualenv in .venv with tinct (editable), its test and docs dependencies and the test
#     support package tinct_testing (editable, from tests/support), reinstalled only when
#     either pyproject.toml changes;
#   - kube-apiserver, kube-controller-manager, kubectl and etcd, Prometheus, helm, kwok
#     and KEDA's operator and metrics API server, built from Go modules into
#     ~/.cache/tinct, each rebuilt only when what it is built from changes
#     (tests/support/tinct_testing/controlplane/build.py);
#   - a Java runtime for the Spark test when none is on PATH (apt-get, as root);
#   - the Debian packages of the end-to-end tier's node and images (runc, the CNI plugins,
#     iptables, conntrack, buildah, debootstrap), when missing (apt-get, as root).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

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
want=$(cat pyproject.toml tests/support/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing Python dependencies into $VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check uv
  "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" -e ".[test,fast,docs]" -e tests/support
  echo "$want" > "$stamp"
fi

# The Spark test reads the lineage tables with Delta's Spark connector, which needs a JVM.
if ! command -v java >/dev/null 2>&1; then
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
if [ -n "$missing" ]; then
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
say "control plane, Prometheus, helm, kwok and KEDA binaries"
"$VENV/bin/python" -m tinct_testing.controlplane.build
