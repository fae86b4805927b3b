"""Tests of the load-test tools: scenario shapes and the suite."""
