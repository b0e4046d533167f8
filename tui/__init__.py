"""kernelab's terminal UI: watch the daemon's queue, devices and convergence live.

It reads the SQLite store and nothing else (never torch, triton, CUDA or the daemon's code),
so it starts in well under a second over SSH on a machine busy with GPU work.
"""
