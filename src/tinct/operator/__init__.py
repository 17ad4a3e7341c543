"""kopf handlers: ModelVersion, GrayRelease, autoscaling, analysis, routing."""
