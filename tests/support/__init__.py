"""Test support: real servers on loopback, processes, fake clocks, helpers."""
