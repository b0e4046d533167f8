"""The kernelab database: one SQLite file, one writer (the daemon), many read-only readers.

The schema is versioned with ``PRAGMA user_version``; each entry of ``MIGRATIONS`` moves the
database one version forward inside a transaction, so an interrupted upgrade leaves the previous
version intact. Migrations only ever add: readers of an older version keep working.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

BUSY_TIMEOUT_MS = 5000

SCHEMA_V1 = """
CREATE TABLE problems (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL,             -- file stem, e.g. "softmax"
    path          TEXT NOT NULL,             -- where the reference was found
    content_hash  TEXT NOT NULL,             -- sha256 of reference + sidecar + starting candidate
    revision      INTEGER NOT NULL DEFAULT 1,
    source        TEXT NOT NULL,             -- the reference's text, kept: the inbox may change
    sidecar       TEXT,                      -- NAME.toml text, if any
    start_source  TEXT,                      -- NAME.new.py text, if any
    status        TEXT NOT NULL DEFAULT 'ok',-- ok | invalid
    error         TEXT,                      -- one line when invalid
    created_at    REAL NOT NULL,
    UNIQUE (name, content_hash)
);

CREATE TABLE jobs (
    id                 INTEGER PRIMARY KEY,
    problem_id         INTEGER NOT NULL REFERENCES problems(id),
    kind               TEXT NOT NULL DEFAULT 'port',   -- port | tune
    state              TEXT NOT NULL DEFAULT 'queued', -- queued running paused done failed cancelled invalid
    device             TEXT,                           -- cpu | cuda:N, set when it runs
    priority           INTEGER NOT NULL DEFAULT 0,     -- higher runs first
    error              TEXT,
    stop_reason        TEXT,
    best_candidate_id  INTEGER,
    reference_ms       REAL,
    reference_noise    REAL,                           -- relative CI half-width of the reference
    sol_ms             REAL,                           -- speed-of-light floor, when known
    capture            TEXT,                           -- JSON: launch records, FLOPs, bytes
    config             TEXT,                           -- JSON: the job's settings
    created_at         REAL NOT NULL,
    started_at         REAL,
    finished_at        REAL,
    updated_at         REAL
);
CREATE INDEX jobs_state ON jobs(state, priority DESC, id);

CREATE TABLE candidates (
    id                 INTEGER PRIMARY KEY,
    job_id             INTEGER NOT NULL REFERENCES jobs(id),
    parent_id          INTEGER REFERENCES candidates(id),
    proposer           TEXT NOT NULL,
    language           TEXT NOT NULL DEFAULT 'triton',
    source             TEXT NOT NULL,
    edit               TEXT,                  -- one line: "BLOCK 512 → 1024" or a rewrite's reason
    params             TEXT,                  -- JSON of declared tunables' values
    state              TEXT NOT NULL DEFAULT 'pending', -- pending evaluating done
    verdict            TEXT,                  -- pass | fail | error
    rule               TEXT,                  -- gate rule that failed
    reason             TEXT,
    evidence           TEXT,                  -- JSON: max error, where, input set index …
    max_rel_error      REAL,
    tolerance          REAL,
    candidate_ms       REAL,
    baseline_ms        REAL,
    speedup            REAL,
    speedup_lo         REAL,
    speedup_hi         REAL,
    faster_than_noise  INTEGER,
    accepted           INTEGER NOT NULL DEFAULT 0,
    result             TEXT,                  -- JSON: the full check result
    created_at         REAL NOT NULL,
    finished_at        REAL
);
CREATE INDEX candidates_job ON candidates(job_id, id);

CREATE TABLE blocks (
    id             INTEGER PRIMARY KEY,
    candidate_id   INTEGER NOT NULL REFERENCES candidates(id),
    side           TEXT NOT NULL,            -- A (baseline) | B (candidate)
    idx            INTEGER NOT NULL,
    samples        TEXT NOT NULL,            -- JSON list of ms
    median_ms      REAL NOT NULL,
    sm_clock_mhz   REAL,
    clock_reasons  TEXT,                     -- names of active clock-event reasons
    temperature_c  REAL,
    power_w        REAL,
    throttled      INTEGER NOT NULL DEFAULT 0,
    created_at     REAL NOT NULL
);
CREATE INDEX blocks_candidate ON blocks(candidate_id, idx);

CREATE TABLE devices (
    id            TEXT PRIMARY KEY,          -- cpu | cuda:N
    name          TEXT NOT NULL,
    uuid          TEXT,
    memory_total_mb REAL,
    ceilings      TEXT,                      -- JSON: measured copy bandwidth, matrix rates
    updated_at    REAL NOT NULL
);

CREATE TABLE gpu_samples (
    id             INTEGER PRIMARY KEY,
    device_id      TEXT NOT NULL,
    ts             REAL NOT NULL,
    util_pct       REAL,
    sm_clock_mhz   REAL,
    mem_clock_mhz  REAL,
    temperature_c  REAL,
    power_w        REAL,
    mem_used_mb    REAL,
    mem_total_mb   REAL,
    clock_reasons  TEXT
);
CREATE INDEX gpu_samples_device_ts ON gpu_samples(device_id, ts);

CREATE TABLE events (
    id       INTEGER PRIMARY KEY,
    ts       REAL NOT NULL,
    level    TEXT NOT NULL DEFAULT 'info',   -- debug info warning error
    job_id   INTEGER,
    kind     TEXT NOT NULL,                  -- e.g. problem.invalid, candidate.accepted
    message  TEXT NOT NULL
);
CREATE INDEX events_ts ON events(ts);

CREATE TABLE commands (
    id        INTEGER PRIMARY KEY,
    ts        REAL NOT NULL,
    job_id    INTEGER,
    verb      TEXT NOT NULL,                 -- pause resume cancel retry priority
    arg       TEXT,
    source    TEXT NOT NULL DEFAULT 'cli',   -- cli | tui
    status    TEXT NOT NULL DEFAULT 'pending', -- pending done rejected
    result    TEXT,
    done_at   REAL
);
CREATE INDEX commands_pending ON commands(status, id);

CREATE TABLE daemon (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    pid           INTEGER,
    host          TEXT,
    version       TEXT,
    started_at    REAL,
    heartbeat_at  REAL,
    status        TEXT
);
"""

# v2: the daemon's bookkeeping. ``active_s`` is the job's accumulated running time, so that
# ``max_minutes`` counts work done, not the hours a stopped daemon was down; the events index
# serves the per-job event log the TUI and reports show.
SCHEMA_V2 = """
ALTER TABLE jobs ADD COLUMN active_s REAL NOT NULL DEFAULT 0;
CREATE INDEX events_job ON events(job_id, id);
CREATE INDEX problems_name ON problems(name, revision);
"""

# Agents as proposers: every exchange with a model or a command agent, linked to the candidate
# it produced (NULL for a failed proposal: no code, not one edit, a timeout, an HTTP error).
SCHEMA_AGENT_EXCHANGES = """
CREATE TABLE agent_exchanges (
    id             INTEGER PRIMARY KEY,
    job_id         INTEGER NOT NULL REFERENCES jobs(id),
    candidate_id   INTEGER REFERENCES candidates(id),
    proposer       TEXT NOT NULL,            -- agents.NAME
    model          TEXT,                     -- the model that answered, or the command
    prompt         TEXT NOT NULL,
    response       TEXT,                     -- the answer as received (partial on a timeout)
    tokens_in      INTEGER,
    tokens_out     INTEGER,
    latency_s      REAL,
    finish_reason  TEXT,                     -- stop | length | … (the server's), or exit N
    status         TEXT NOT NULL,            -- ok | failed | unused (asked ahead, job over)
    error          TEXT,                     -- one line when failed
    created_at     REAL NOT NULL
);
CREATE INDEX agent_exchanges_candidate ON agent_exchanges(candidate_id);
CREATE INDEX agent_exchanges_job ON agent_exchanges(job_id, id);
"""

# Devices across a cluster's nodes: each device and each job records the node (the host's
# name locally, Ray's node name under ``[cluster] backend = "ray"``) beside the device id.
SCHEMA_CLUSTER_NODES = """
ALTER TABLE devices ADD COLUMN node TEXT;
ALTER TABLE jobs ADD COLUMN node TEXT;
"""

# Machine-code fingerprints of candidates (``store.fingerprints``): the kernels' figures as JSON,
# their PTX and SASS as zlib-compressed JSON, or why none could be made.
SCHEMA_FINGERPRINTS = """
CREATE TABLE fingerprints (
    candidate_id  INTEGER PRIMARY KEY REFERENCES candidates(id),
    arch          TEXT,                      -- sm_90
    kernels       TEXT NOT NULL,             -- JSON {"kernels": [...]}, as kernelab fingerprint --json
    code          BLOB,                      -- zlib(JSON [{"name", "ptx", "sass"}])
    error         TEXT,                      -- one line when none could be made
    created_at    REAL NOT NULL
);
"""

# Scale, search and peers (issues 13, 14, 15, 20): a job's memory plan and the peers it was
# measured against (torch.compile), the worker deaths seen during a candidate's evaluation
# (twice makes it a poison candidate, rule ``hostile``), every configuration a job screened,
# the per-device cache of the best configurations found, and ceilings kept per device per home
# (for ``kernelab port`` too), measured again only when the driver, device or clocks change.
SCHEMA_SCALE_AND_SEARCH = """
ALTER TABLE jobs ADD COLUMN plan TEXT;            -- JSON: the memory plan (harness.plan)
ALTER TABLE jobs ADD COLUMN peers TEXT;           -- JSON: eager and torch.compile timings
ALTER TABLE candidates ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;
CREATE TABLE screened (
    id            INTEGER PRIMARY KEY,
    job_id        INTEGER NOT NULL REFERENCES jobs(id),
    parent_id     INTEGER REFERENCES candidates(id),   -- the incumbent the batch varies
    candidate_id  INTEGER REFERENCES candidates(id),   -- set when it went on to the full gate
    proposer      TEXT NOT NULL,
    params        TEXT NOT NULL,                       -- JSON of the tunables' values
    status        TEXT NOT NULL,                       -- timed | spills | too_big | failed | wrong
    ms            REAL,                                -- screened time (never a result)
    registers     INTEGER,
    spills        INTEGER,
    detail        TEXT,
    created_at    REAL NOT NULL
);
CREATE INDEX screened_job ON screened(job_id, id);
CREATE TABLE tuning_cache (
    device_name   TEXT NOT NULL,                       -- e.g. "NVIDIA H200"
    signature     TEXT NOT NULL,                       -- the kernel family and its source hash
    shapes        TEXT NOT NULL,                       -- the problem's sizes, as JSON
    params        TEXT NOT NULL,                       -- JSON of the best configuration
    ms            REAL,
    job_id        INTEGER,
    updated_at    REAL NOT NULL,
    PRIMARY KEY (device_name, signature, shapes)
);
CREATE TABLE ceilings (
    key           TEXT PRIMARY KEY,                    -- device uuid | driver | clock mode
    device_name   TEXT,
    ceilings      TEXT NOT NULL,                       -- JSON, as devices.ceilings
    measured_at   REAL NOT NULL
);
"""

MIGRATIONS: list[str] = [SCHEMA_V1, SCHEMA_V2, SCHEMA_AGENT_EXCHANGES, SCHEMA_CLUSTER_NODES, SCHEMA_FINGERPRINTS,
                         SCHEMA_SCALE_AND_SEARCH]
SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(RuntimeError):
    """The database cannot be used as asked (missing, newer schema, not writable)."""


class NotCreatedYet(StoreError):
    """The file exists but holds no schema yet: its writer is creating it this moment (or it
    is not a kernelab database). Readers treat it as no database at all."""


def connect(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    """Open the database; the writer also creates and migrates it.

    Readers open with ``mode=ro`` so that a TUI run by a user without write access still
    works, and so that no reader can ever take the write lock from the daemon.
    """
    path = Path(path)
    if readonly:
        if not path.exists():
            raise StoreError(f"{path}: no database yet (has the daemon run with this home?)")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                               check_same_thread=False)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    if readonly:
        _check_version(conn, path)
    else:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        migrate(conn)
    return conn


def _check_version(conn: sqlite3.Connection, path: Path) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        conn.close()
        raise NotCreatedYet(f"{path}: no database yet (its schema is being created, or this is "
                            "not a kernelab database)")
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path}: schema version {version} is newer than this kernelab "
                         f"({SCHEMA_VERSION}); upgrade kernelab")


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to ``SCHEMA_VERSION``; returns the version found before."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise StoreError(f"schema version {found} is newer than this kernelab ({SCHEMA_VERSION})")
    for version in range(found, SCHEMA_VERSION):
        with conn:
            conn.executescript(f"BEGIN;\n{MIGRATIONS[version]}\nPRAGMA user_version = {version + 1};")
    return found
