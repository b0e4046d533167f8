"""What runs inside a sandbox process, next to untrusted code."""
