"""The kopf operator: handler modules (``cli.HANDLER_MODULES``), their shared context, settings.

Today one handler module: :mod:`tinct.operator.modelversion`.
"""
