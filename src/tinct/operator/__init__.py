"""The kopf operator: handler modules (``cli.HANDLER_MODULES``), their shared context, settings.

Two handler modules: :mod:`tinct.operator.modelversion` (ModelVersions: artifacts hashed,
checked and recorded in the lineage tables) and :mod:`tinct.operator.grayrelease.handler`
(the GrayRelease controller, :mod:`tinct.operator.grayrelease`).
"""
