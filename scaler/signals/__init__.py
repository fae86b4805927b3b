"""Signal sources (NATS, JetStream, Prometheus, HTTP push) and the signal store."""
