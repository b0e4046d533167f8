"""``kernelab.toml``: every setting with its default, loaded strictly.

Unknown sections or keys are errors rather than silently ignored: a misspelt ``lock_clock``
that quietly did nothing would be worse than a refusal to start.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """The configuration file is malformed; the message names the file and the key."""


@dataclass
class DaemonConfig:
    gpus: list[int] = field(default_factory=list)   # empty: every GPU NVML finds
    polling_observer: bool = False                  # for network filesystems
    stable_s: float = 2.0                           # size+mtime unchanged this long = complete
    rescan_s: float = 30.0                          # periodic full rescan of the inbox
    gpu_sample_s: float = 1.0                       # NVML sampling period for the TUI
    log_level: str = "info"


# torch.compile modes a job can time as the user's peers ([jobs] peers), by the key each is
# reported under (report.json "peers": {"compile_ms", "compile_max_autotune_ms", …}).
PEER_MODES = {"compile": "default", "compile_max_autotune": "max-autotune-no-cudagraphs"}


@dataclass
class JobsConfig:
    max_candidates: int = 40
    max_minutes: float = 30.0
    patience: int = 8                               # proposals without an accepted gain
    proposers: list[str] = field(default_factory=lambda: ["template", "inductor", "tune"])
    peers: list[str] = field(default_factory=lambda: ["compile", "compile_max_autotune"])  # torch.compile modes timed


@dataclass
class GateConfig:
    tol_factor: float = 10.0      # tolerance = tol_factor × the fp32 reference's own error …
    timeout_s: float = 300.0      # … floored per dtype; per-evaluation deadline
    reseed_every: int = 8         # candidates between fresh secret seeds (0 = never)


@dataclass
class TimingConfig:
    budget_s: float = 8.0             # wall time for interleaved A/B blocks of one comparison
    target_rel_noise: float = 0.005   # stop once the speedup CI half-width is under this
    min_pairs: int = 6                # A/B block pairs before the noise target may stop it
    min_gain: float = 0.01            # a kept candidate must be at least this much faster
    block_ms: float = 40.0            # aim for blocks of about this much device time
    lock_clocks: str = "off"          # off | base | max | <MHz>: only on a box you own


ISOLATION_CHOICES = ("namespaces", "none")


@dataclass
class SandboxConfig:
    user: str = ""                    # when root, sandboxes drop to this user ("" = nobody)
    memory_gb: float = 0.0            # host memory limit per sandbox, 0 = none
    isolation: str = "namespaces"     # namespaces | none (candidates unfenced: only by choice)


@dataclass
class SearchConfig:
    """Screening: many configurations of a kernel compiled in parallel and timed briefly, the
    best few gated and timed in A/B like any candidate (docs/port.md, ``tune``)."""

    batch: int = 32                   # configurations a screened batch holds (0: no screening)
    contenders: int = 2               # the best screened, if faster than the incumbent's, gated
    screen_ms: float = 5.0            # device time each configuration is timed for
    compile_workers: int = 0          # compile-only processes (0: one a core)
    on_cpu: bool = False              # CPU jobs screen too (the interpreter's times say little)
    cpu_arch: str = ""                # CPU jobs: compile for this arch (sm_90): spills, fingerprints


AGENT_KINDS = ("openai", "command")


@dataclass
class AgentConfig:
    """One ``[agents.NAME]`` table: a model endpoint or a command-line agent as a proposer.
    The API key is named (``api_key_env``), never written here, so the file can be shared."""

    kind: str = ""                    # openai | command
    base_url: str = ""                # openai: the endpoint up to /v1
    model: str = ""                   # openai: the served model's name
    api_key_env: str = ""             # openai: NAME of the variable holding the key ("" = none)
    max_tokens: int = 8192            # openai: per answer
    timeout_s: float = 300.0          # one answer (openai) or one run (command)
    stream: bool = True               # openai: ask for server-sent events
    retries: int = 4                  # openai: retries on 429 and 5xx, with backoff
    command: list[str] = field(default_factory=list)   # command: argv; {prompt} {workdir}
    pass_env: list[str] = field(default_factory=list)  # command: variables it may see
    max_proposals: int = 20           # budget per job: answers asked for
    max_total_tokens: int = 0         # budget per job: tokens in + out, 0 = none
    max_minutes: float = 0.0          # budget per job: wall time waiting on it, 0 = none
CLUSTER_BACKENDS = ("local", "ray")


@dataclass
class ClusterConfig:
    backend: str = "local"            # local: this box's devices; ray: a Ray cluster's
    address: str = "auto"             # Ray's address: auto | HOST:PORT | ray://HOST:PORT


@dataclass
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    agents: dict[str, AgentConfig] = field(default_factory=dict)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _section(cls: type, name: str, values: Any, source: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: [{name}] must be a table")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) in [{name}]: {', '.join(unknown)}")
    obj = cls()
    for key, value in values.items():
        default = getattr(obj, key)
        if isinstance(default, bool) != isinstance(value, bool) or (
            not isinstance(value, type(default))
            and not (isinstance(default, float) and isinstance(value, int))
        ):
            raise ConfigError(f"{source}: [{name}] {key} must be {type(default).__name__}, "
                              f"got {value!r}")
        setattr(obj, key, float(value) if isinstance(default, float) else value)
    return obj


def parse(text: str, source: str = "kernelab.toml") -> Config:
    """Parse a configuration text; every error names ``source`` and the offending key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    sections = {f.name: f.type for f in fields(Config)}
    unknown = sorted(set(data) - set(sections))
    if unknown:
        raise ConfigError(f"{source}: unknown section(s): {', '.join(unknown)}")
    cfg = Config()
    cfg.agents = _agents(data.pop("agents", {}), source)
    for f in fields(Config):
        if f.name in data:
            setattr(cfg, f.name, _section(type(getattr(cfg, f.name)), f.name, data[f.name], source))
    validate_lock_clocks(cfg.timing.lock_clocks, source)
    bad = [p for p in cfg.jobs.peers if p not in PEER_MODES]
    if bad:
        raise ConfigError(f"{source}: [jobs] peers must be a subset of {list(PEER_MODES)}, got {bad}")
    validate_cluster(cfg.cluster, source)
    if cfg.sandbox.isolation not in ISOLATION_CHOICES:
        raise ConfigError(f"{source}: [sandbox] isolation must be one of {', '.join(ISOLATION_CHOICES)}, "
                          f"got {cfg.sandbox.isolation!r}")
    return cfg


def _agents(tables: Any, source: str) -> dict[str, AgentConfig]:
    """``[agents.NAME]`` tables, each checked for what its ``kind`` needs to run."""
    if not isinstance(tables, dict):
        raise ConfigError(f"{source}: [agents] must hold [agents.NAME] tables")
    agents = {}
    for name, values in tables.items():
        section = f"agents.{name}"
        agent = _section(AgentConfig, section, values, source)
        if agent.kind not in AGENT_KINDS:
            raise ConfigError(f"{source}: [{section}] kind must be one of {', '.join(AGENT_KINDS)}, "
                              f"got {agent.kind!r}")
        needed = ("base_url", "model") if agent.kind == "openai" else ("command",)
        missing = [key for key in needed if not getattr(agent, key)]
        if missing:
            raise ConfigError(f"{source}: [{section}] kind = {agent.kind!r} needs "
                              f"{', '.join(missing)}")
        if not all(isinstance(a, str) for a in agent.command + agent.pass_env):
            raise ConfigError(f"{source}: [{section}] command and pass_env must be lists of strings")
        if agent.timeout_s <= 0:
            raise ConfigError(f"{source}: [{section}] timeout_s must be positive")
        agents[name] = agent
    return agents


def validate_lock_clocks(value: str, source: str = "kernelab.toml") -> None:
    if value in ("off", "base", "max") or value.isdigit():
        return
    raise ConfigError(f"{source}: [timing] lock_clocks must be off, base, max or MHz, got {value!r}")


def validate_cluster(cluster: ClusterConfig, source: str = "kernelab.toml") -> None:
    if cluster.backend not in CLUSTER_BACKENDS:
        raise ConfigError(f"{source}: [cluster] backend must be one of "
                          f"{', '.join(CLUSTER_BACKENDS)}, got {cluster.backend!r}")
    if not cluster.address.strip():
        raise ConfigError(f"{source}: [cluster] address must be auto, HOST:PORT or "
                          "ray://HOST:PORT, got ''")


def load(path: Path) -> Config:
    """Load ``path``, or the defaults when it does not exist."""
    if not path.exists():
        return Config()
    return parse(path.read_text(), str(path))


DEFAULT_TOML = """\
# kernelab configuration: /etc/kernelab/kernelab.toml for the system service
# (~/.config/kernelab/kernelab.toml for the user service; KERNELAB_HOME/kernelab.toml
# otherwise). `kernelab service install` links it into the state directory.
#
# Every key is optional and every value shown is the default. Unknown sections or keys are
# errors, so a misspelt key stops the daemon instead of being ignored.
# After editing: sudo systemctl restart kernelabd, then kernelab doctor.

[daemon]
# GPU indices (CUDA_DEVICE_ORDER=PCI_BUS_ID, the order nvidia-smi shows) that kernelab may
# use. Empty: every GPU NVML finds. On a shared box, list only the GPUs kernelab owns.
gpus = []
# Poll the inbox instead of using inotify. Needed when the inbox is on NFS/CIFS, where
# inotify does not see files written from other hosts.
polling_observer = false
# A file dropped in the inbox counts as complete once its size and mtime have not changed
# for this many seconds (scp and editors write in several steps).
stable_s = 2.0
# Full rescan of the inbox every this many seconds, so that a missed event never loses a file.
rescan_s = 30.0
# NVML sampling period for the GPU panel of the TUI (utilisation, clocks, temperature, power).
gpu_sample_s = 1.0
# debug | info | warning | error. The daemon's --log-level overrides it.
log_level = "info"

[jobs]
# A job stops after this many candidates ...
max_candidates = 40
# ... or after this many minutes ...
max_minutes = 30.0
# ... or after this many proposals in a row without an accepted gain.
patience = 8
# Proposers that suggest candidates, in this order (README: "Proposers").
proposers = ["template", "inductor", "tune"]
# torch.compile modes a GPU job times the reference under after its first candidate, as the peers a kept
# candidate is compared with (report.json "peers"): "compile" (the default mode) and
# "compile_max_autotune" (max-autotune-no-cudagraphs). [] = none.
peers = ["compile", "compile_max_autotune"]

[gate]
# A candidate passes when its error against the float64 oracle is within tol_factor times
# the fp32 reference's own error on the same inputs (floored per dtype).
tol_factor = 10.0
# Deadline of one evaluation in seconds; a hang past it is killed and recorded as a failure.
timeout_s = 300.0
# Candidates between fresh secret seeds for the gate's inputs, so that no proposer can learn
# them from its failures (0 = never).
reseed_every = 8

[timing]
# Wall-time budget in seconds of one interleaved A/B comparison.
budget_s = 8.0
# Stop sampling early once the speedup's confidence half-width is below this (0.5 %).
target_rel_noise = 0.005
# Interleaved A/B block pairs measured before the noise target may stop a comparison.
min_pairs = 6
# A candidate is kept only when its speedup's CI lies above 1 + max(min_gain, A/A noise).
min_gain = 0.01
# Device time in milliseconds per measurement block.
block_ms = 40.0
# Lock the SM clock while timing, so boost and thermal drift add less noise.
#   off    do not touch clocks (default); every block still records the clock state, and
#          blocks measured under thermal or power slowdown are discarded and re-run
#   base   lock to the GPU's base (TDP) clock: the most stable numbers
#   max    lock to the maximum clock: the fastest numbers, more thermal throttling
#   <MHz>  lock to this many MHz, as a string, e.g. "1500"
# Only on a box you own and nobody else benchmarks on: locked clocks slow or change every
# other program on the GPU. NVML only lets root lock clocks (Volta or newer), so the daemon
# must run as root: `sudo systemctl edit kernelabd`, add [Service] User=root, and set
# [sandbox] user below so candidates do not run as root. kernelab releases the clocks on
# every exit, and the unit's ExecStopPost= (kernelab service release-clocks) releases them
# after a crash too. Check first with: kernelab doctor (the "clocks" line).
lock_clocks = "off"

[sandbox]
# Every sandbox runs in its own user, PID, mount, network and IPC namespaces, sees only its
# files and a read-only Python environment, and has a system-call filter (docs/gate.md).
# "none" runs candidates as the daemon's own user with none of that: only on a machine where
# namespaces are unavailable and you trust every candidate. `kernelab doctor` says what is active.
isolation = "namespaces"
# When the daemon runs as root, candidates and references run as this user ("" = nobody).
user = ""
# Host memory limit per sandbox in GiB; 0 = none. Enforced with a cgroup where the daemon may
# make one (systemd Delegate=yes, or root), else RLIMIT_AS on CPU, else a resident-memory
# watchdog (CUDA reserves huge address ranges, so a GPU sandbox never gets RLIMIT_AS).
memory_gb = 0.0

[search]
# Screening (docs/port.md, "tune"): a batch of configurations of the incumbent is compiled in
# parallel, checked for spills, and timed briefly; only the best few that beat the incumbent's
# own screened time go on to the full gate and A/B. Configurations a batch holds (0 = none).
batch = 32
# Screened configurations gated and timed in A/B per batch, fastest first.
contenders = 2
# Device time each configuration is timed for while screened, in ms.
screen_ms = 5.0
# Compile-only processes per batch; 0 = one a core.
compile_workers = 0
# CPU jobs screen too (Triton's interpreter, host timing: for tests and laptops; its times say
# little of a GPU's, so by default a CPU job changes one tunable per candidate instead).
on_cpu = false
# CPU jobs only: also compile for this GPU arch ("sm_90") to drop spilling configurations and to
# make each candidate's machine-code fingerprint (as on a GPU).
cpu_arch = ""

# Agents as proposers (README.md, "Agents"): name one in [jobs] proposers as "agents.NAME",
# or per job with `kernelab port REF --proposer agents.NAME` (every key: docs/service.md).
# [agents.local]
# kind = "openai"                        # any OpenAI-compatible /v1/chat/completions endpoint
# base_url = "http://127.0.0.1:8000/v1"
# model = "qwen2.5-coder-32b"
# api_key_env = "OPENAI_API_KEY"         # optional: the NAME of the variable, never the key
# max_tokens = 8192
# timeout_s = 300
#
# [agents.cli]
# kind = "command"                       # a coding agent run non-interactively
# command = ["my-agent", "--prompt-file", "{prompt}", "--workdir", "{workdir}"]
# timeout_s = 600

[cluster]
# "local": this box's GPUs (default). "ray": evaluations run on a Ray cluster's GPUs, one
# actor per running job, while this daemon (on the head) keeps the inbox, the database and
# the TUI; needs pip install 'kernelab[ray]' on every node (docs/cluster.md).
backend = "local"
# Ray's address when backend = "ray": "auto" (the cluster this node belongs to, started with
# ray start), "HOST:PORT" (the head's GCS) or "ray://HOST:PORT" (Ray Client).
address = "auto"
"""
