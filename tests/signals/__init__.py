"""Tests of the signal sources and the signal store."""
