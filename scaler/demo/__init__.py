"""`scaler demo`: the real service scaling a simulated GPU cluster over an embedded nats-server."""
