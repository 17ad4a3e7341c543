"""The tinct API: custom resource models (the source of the CRDs) and data contracts."""
