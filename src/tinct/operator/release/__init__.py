"""The GrayRelease controller.

One package, so the safety rules live where a reader can check them:

- :mod:`~tinct.operator.release.decide`: the pure decision, recorded status in and new
  status out; every rule about when traffic may move is in it.
- :mod:`~tinct.operator.release.preconditions`: what keeps a release from progressing, and
  whose problem it is.
- :mod:`~tinct.operator.release.analysis`: the verdict of one analysis window, from the
  router metrics (:mod:`~tinct.operator.release.samples`) and the engines' own
  (:mod:`~tinct.operator.release.engine`) in Prometheus;
  :mod:`~tinct.operator.release.prometheus`: the bounded client that reads them, and which
  Prometheus a release may read.
- :mod:`~tinct.operator.release.scaling`: the HorizontalPodAutoscalers of both sides.
- :mod:`~tinct.operator.release.tables`: the routing table a recorded status calls for.
- :mod:`~tinct.operator.release.kube`: the Kubernetes writes.
- :mod:`~tinct.operator.release.metrics`: the controller's own Prometheus metrics.
- :mod:`~tinct.operator.release.handler`: the kopf handlers that gather the inputs,
  persist each decision and then apply what the recorded status calls for.
"""
