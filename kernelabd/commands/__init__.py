"""One module per CLI command group; ``kernelabd.cli`` imports each only when it is invoked."""
