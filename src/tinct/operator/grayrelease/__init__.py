"""The GrayRelease controller.

One package, so the safety rules live where a reader can check them:

- :mod:`~tinct.operator.grayrelease.decide`: the pure decision, recorded status in and new
  status out; every rule about when traffic may move is in it. What it takes and gives
  (:mod:`~tinct.operator.grayrelease.decision`); the round it works on and its moves
  (:mod:`~tinct.operator.grayrelease.round`); manual actions
  (:mod:`~tinct.operator.grayrelease.manual`); when a step's window closes
  (:mod:`~tinct.operator.grayrelease.timing`); the conditions people read
  (:mod:`~tinct.operator.grayrelease.conditions`).
- :mod:`~tinct.operator.grayrelease.preconditions`: what keeps a release from progressing, and
  whose problem it is.
- :mod:`~tinct.operator.grayrelease.analysis`: the verdict of one analysis window, from the
  router metrics (:mod:`~tinct.operator.grayrelease.samples`) and the engines' own
  (:mod:`~tinct.operator.grayrelease.engine`) in Prometheus;
  :mod:`~tinct.operator.grayrelease.prometheus`: the bounded client that reads them, and which
  Prometheus a release may read.
- :mod:`~tinct.operator.grayrelease.shares`: the weights a status puts in force (by the
  routing table's rule) and the replicas a share of the traffic needs.
- :mod:`~tinct.operator.grayrelease.scaling`: the plan of what scales each side (HPA or KEDA
  ScaledObject, its bounds and signal, whose scalers are there); its writers
  :mod:`~tinct.operator.grayrelease.hpa` and :mod:`~tinct.operator.grayrelease.scaledobject`
  render it, on what they share (:mod:`~tinct.operator.grayrelease.scalers`).
- :mod:`~tinct.operator.grayrelease.tables`: the routing table a recorded status calls for.
- :mod:`~tinct.operator.grayrelease.kube`: the Kubernetes writes.
- :mod:`~tinct.operator.grayrelease.metrics`: the controller's own Prometheus metrics.
- :mod:`~tinct.operator.grayrelease.handler`: the kopf handlers that gather the inputs,
  persist each decision and then apply what the recorded status calls for.
"""
