"""Event-driven autoscaler for GPU inference on Kubernetes."""

__version__ = "0.1.0"
