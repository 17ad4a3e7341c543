"""Delta Lake lineage store and artifact hashing/validation."""
