"""tinct's test support: the real control plane and its tools, and the helpers the tests,
the demo, the development stack and the benchmarks share.

Installed editable beside tinct by ``scripts/bootstrap.sh`` (``pip install -e tests/support``);
never part of tinct's wheel or image. ``controlplane`` builds and runs kube-apiserver, etcd,
kube-controller-manager, kwok, Prometheus, helm, KEDA and a real node; ``wait.eventually`` is
the one way to wait for a state.
"""
