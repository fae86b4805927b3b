"""The bottom layer: vocabulary, settings, backoff, error text; imports nothing from scaler."""
