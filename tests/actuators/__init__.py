"""Tests of the Kubernetes adapters and the API emulator."""
