"""Shadow traffic's comparer: pairs of answers in, verdicts, metrics and lineage rows out.

Routers mirror a share of stable's requests to the candidate and send each pair -- the
request, stable's answer, the candidate's -- to ``tinct comparer``
(:mod:`tinct.shadow.service`), which admits pairs only for releases a routing table with a
shadow share names (:mod:`~tinct.shadow.intake`), assembles streamed answers
(:mod:`~tinct.shadow.assemble`), compares them layer by layer (:mod:`~tinct.shadow.compare`,
:mod:`~tinct.shadow.layers`), asks the optional judge (:mod:`~tinct.shadow.judge`), counts
(:mod:`~tinct.shadow.metrics`) and records (:mod:`~tinct.shadow.record`).
"""
