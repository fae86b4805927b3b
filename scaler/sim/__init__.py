"""Simulation of a GPU cluster for replaying traces against scaling strategies."""
