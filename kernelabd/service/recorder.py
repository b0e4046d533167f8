"""The ``LocalRecorder``: how the convergence loop writes to the store, in the daemon for its
workers (over the RPC pipe, limited to ``RPC_METHODS``) or in a foreground ``kernelab port``."""

from __future__ import annotations

import json
from typing import Any

from store import fingerprints, search
from store.home import Home
from store.records import Store


class LocalRecorder:
    """The convergence loop's ``Recorder`` over the writer's ``Store``; it also keeps
    ``results/NAME/`` current on every acceptance."""

    def __init__(self, store: Store, home: Home) -> None:
        self.store = store
        self.home = home

    def load(self, job_id: int) -> dict[str, Any]:
        job = self.store.job(job_id)
        if job is None:
            raise LookupError(f"no job {job_id}")
        job_config = json.loads(job["config"] or "{}")
        for key in ("capture", "plan", "peers"):
            if isinstance(job.get(key), str):
                job[key] = json.loads(job[key])
        return {"job": job, "job_config": job_config, "candidates": self.store.candidates(job_id),
                "fingerprints": fingerprints.load_job(self.store.conn, job_id)}

    def add_candidate(self, job_id: int, proposal: dict[str, Any], proposer: str) -> int:
        return self.store.add_candidate(job_id, proposer=proposer, source=proposal["source"],
                                        parent_id=proposal.get("parent_id"),
                                        edit=proposal.get("edit"), params=proposal.get("params"),
                                        language=proposal.get("language") or "triton")

    def start_candidate(self, candidate_id: int) -> None:
        self.store.start_candidate(candidate_id)

    def finish_candidate(self, job_id: int, candidate_id: int, result: dict[str, Any],
                         accepted: bool) -> None:
        self.store.finish_candidate(candidate_id, result, accepted)
        if accepted:
            from kernelabd.service.reports import write_results

            write_results(self.store, self.home, job_id)

    def add_fingerprint(self, candidate_id: int, found: dict[str, Any], seconds: float) -> None:
        """A candidate's fingerprint, made beside its evaluation and ended after its verdict was
        recorded: kept apart from the result, its code compressed, and its seconds a stage."""
        fingerprints.save(self.store.conn, candidate_id, found)
        self.store.add_stage(candidate_id, "fingerprint", seconds)

    def update_job(self, job_id: int, fields: dict[str, Any]) -> None:
        allowed = {"reference_ms", "reference_noise", "sol_ms", "capture", "plan", "peers"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"a worker may not set {sorted(bad)}")
        fields = {k: json.dumps(v) if k in ("capture", "plan", "peers") and isinstance(v, dict) else v
                  for k, v in fields.items()}
        self.store.update_job(job_id, **fields)

    def add_active_time(self, job_id: int, seconds: float) -> None:
        self.store.add_active_time(job_id, seconds)

    def ceilings(self, key: str) -> dict[str, Any] | None:
        """Ceilings this home measured under ``key`` (device, driver, clocks), if any."""
        return search.ceilings(self.store.conn, key)

    def keep_ceilings(self, job_id: int, key: str, ceilings: dict[str, Any]) -> None:
        """Keep freshly measured ceilings for every later job in this home under ``key``, and
        with the job's registered device (``kernelab doctor`` lists those)."""
        search.keep_ceilings(self.store.conn, key, ceilings.get("device_name"), ceilings)
        job = self.store.job(job_id)
        if job and job["device"]:
            self.store.set_device_ceilings(job["device"], ceilings)

    def screened(self, job_id: int) -> list[dict[str, Any]]:
        return search.screened(self.store.conn, job_id)

    def add_screened(self, job_id: int, rows: list[dict[str, Any]]) -> list[int]:
        return search.add_screened(self.store.conn, job_id, rows)

    def link_screened(self, screened_id: int, candidate_id: int) -> None:
        search.link_screened(self.store.conn, screened_id, candidate_id)

    def cached_configs(self, device_name: str, signature: str, family: str, shapes: str) -> list[dict[str, Any]]:
        return search.cached(self.store.conn, device_name, signature, family, shapes)

    def cache_best(self, entry: dict[str, Any]) -> bool:
        return search.cache_best(self.store.conn, entry)

    def event(self, kind: str, message: str, level: str = "info",
              job_id: int | None = None) -> None:
        self.store.event(kind, message, level=level, job_id=job_id)

    def add_exchange(self, job_id: int, candidate_id: int | None, exchange: dict[str, Any]) -> None:
        """Keep an agent's exchange, with the candidate it produced (None: a failed proposal)."""
        from store.exchanges import add_exchange

        add_exchange(self.store.conn, job_id, candidate_id, exchange)

    def end_job(self, job_id: int, state: str, stop_reason: str | None,
                error: str | None) -> None:
        from kernelabd.service.reports import write_results

        self.store.end_job(job_id, state, stop_reason=stop_reason, error=error)
        write_results(self.store, self.home, job_id)
        detail = error if error else stop_reason
        self.store.event(f"job.{state}", detail or "", job_id=job_id,
                         level="info" if state == "done" else "warning")


# The calls a worker may make on the daemon's recorder (nothing else crosses the pipe).
RPC_METHODS = frozenset({"load", "add_candidate", "start_candidate", "finish_candidate", "add_fingerprint",
                         "update_job", "add_active_time", "event", "end_job",
                         "add_exchange", "ceilings", "keep_ceilings", "screened", "add_screened",
                         "link_screened", "cached_configs", "cache_best"})
