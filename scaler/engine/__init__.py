"""The pure decision engine: policy, signals, cluster state and time in; a decision out."""
