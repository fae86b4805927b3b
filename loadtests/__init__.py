"""Load tests: synthetic scenarios and the suite that runs them with the shared traces."""
