"""Proposers: each turns a job's context into the next single-edit candidate (``base``)."""
