"""kernelab's daemon and harness: load, sandbox, gate, time, accept, converge."""

__version__ = "0.1.0"
