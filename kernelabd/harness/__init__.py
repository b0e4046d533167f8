"""What decides a verdict and a time. Everything here touches the trust boundary: it loads,
runs, compares or times untrusted code. Never imports ``kernelabd.service``."""
