"""The long-running service: reactor, HTTP APIs and observability."""
