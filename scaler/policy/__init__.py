"""ScalePolicy files: models, loading and validation."""
