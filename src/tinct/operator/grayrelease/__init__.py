"""The GrayRelease controller.

One package, so the safety rules live where a reader can check them. A round of a release
reads the world, decides, records the decision and acts on what was recorded:

- :mod:`~tinct.operator.grayrelease.handler`: the kopf handlers: one daemon per release runs
  its rounds; events wake it; deleting a release leaves its model's route.
- :mod:`~tinct.operator.grayrelease.reconcile`: one round: gather, decide, record, act,
  history.
- :mod:`~tinct.operator.grayrelease.runtime`: what the release daemons of a process share,
  and what the process remembers of each release (the status it wrote last, a decision
  whose write failed, the actions the watch delivered).

Reading the world:

- :mod:`~tinct.operator.grayrelease.world`: the watch caches (kopf indices) and what a round
  gathers from them, Prometheus and the lineage tables.
- :mod:`~tinct.operator.grayrelease.preconditions`: what keeps a release from progressing, and
  whose problem it is.
- :mod:`~tinct.operator.grayrelease.analysis`: reads one analysis window from Prometheus, the
  router metrics (:mod:`~tinct.operator.grayrelease.samples`) and the engines' own
  (:mod:`~tinct.operator.grayrelease.engine`), and :mod:`~tinct.operator.grayrelease.verdict`
  judges it; :mod:`~tinct.operator.grayrelease.prometheus`: the bounded client that reads
  them, and which Prometheus a release may read.

The decision (pure):

- :mod:`~tinct.operator.grayrelease.decide`: recorded status in, new status out; every rule
  about when traffic may move is in it. What it takes and gives
  (:mod:`~tinct.operator.grayrelease.decision`); the round it works on and its moves
  (:mod:`~tinct.operator.grayrelease.round`); manual actions
  (:mod:`~tinct.operator.grayrelease.manual`); when a step's window closes
  (:mod:`~tinct.operator.grayrelease.timing`); the weights a status puts in force, by the
  routing table's rule, and the replicas a share needs
  (:mod:`~tinct.operator.grayrelease.shares`); the conditions people read
  (:mod:`~tinct.operator.grayrelease.conditions`).
- :mod:`~tinct.operator.grayrelease.tables`: the routing table a recorded status calls for.
- :mod:`~tinct.operator.grayrelease.loading`: a LoRA adapter candidate on stable's pods: what
  status records of it, where to load or unload it, and what holds it at weight 0.
- :mod:`~tinct.operator.grayrelease.scaling`: the plan of what scales each side (HPA or KEDA
  ScaledObject, its bounds and signal, whose scalers are there); its writers
  :mod:`~tinct.operator.grayrelease.hpa` and :mod:`~tinct.operator.grayrelease.scaledobject`
  render it, on what they share (:mod:`~tinct.operator.grayrelease.scalers`).

Acting on the cluster:

- :mod:`~tinct.operator.grayrelease.act`: the routing table, the scalers, standing routes,
  the history rows and Events, as the recorded status calls for them.
- :mod:`~tinct.operator.grayrelease.kube`: the Kubernetes calls, and the watch of the
  routing tables.
- :mod:`~tinct.operator.grayrelease.adapters`: loads a LoRA adapter candidate into stable's
  pods through the engine's API, and unloads it after a rollback or deletion.
- :mod:`~tinct.operator.grayrelease.notify`: the webhooks that hear of recorded transitions.
- :mod:`~tinct.operator.grayrelease.metrics`: the controller's own Prometheus metrics.
"""
