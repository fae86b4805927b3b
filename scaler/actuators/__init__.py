"""Kubernetes adapters: the only package that talks to the Kubernetes API."""
