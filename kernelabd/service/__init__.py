"""What runs the box: the daemon, its scheduler and workers, the inbox, the convergence loop
around the harness, reports, devices, notify and doctor."""
