"""The fleet replay example (FLEET.yaml, its policies, pool and budgets) and its runner."""
