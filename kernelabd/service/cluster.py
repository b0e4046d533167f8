"""Evaluations on a Ray cluster (``[cluster] backend = "ray"``): one queue, many GPU boxes.

The daemon on the head keeps what it keeps locally — the inbox, the one SQLite writer, the
commands table — and only where a job's worker runs changes. Each running job has a Ray actor
that holds one device on whichever node has one free (``num_gpus=1``; on CPU-only clusters a
``kernelab_cpu`` custom resource stands in) and runs the very worker process a local device
runs (``scheduler.Worker``: the same sandboxes, timing rules and clock records). The actor only
relays the worker's pipe: the daemon long-polls it for the worker's next call and answers it
from its recorder, limited to ``RPC_METHODS`` as locally, so results and events land in the
store on the head and no node ever writes the database.

A node that dies takes its actor with it; Ray reports that as ``RayActorError`` on the pending
poll. The job then goes back to the queue with its in-flight candidate ``pending`` — the store
is the truth, exactly as after a daemon restart — and the next free device, on a live node,
evaluates that candidate again and carries on.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from kernelabd.config import Config
from kernelabd.harness import nvml as nvml_lib
from kernelabd.harness.problem import one_line
from kernelabd.service.devices import Device, DeviceError, cpu_device, nvml_devices
from kernelabd.service.recorder import RPC_METHODS, LocalRecorder
from kernelabd.service.scheduler import Scheduler, Worker
from store.home import Home
from store.records import Store

CPU_RESOURCE = "kernelab_cpu"
"""The custom resource a node offers for CPU "devices" (Triton's interpreter): ``ray start
--resources='{"kernelab_cpu": 1}'``. GPUs are Ray's own ``GPU`` resource."""

POLL_S = 2.0
"""How long one poll of an actor waits for its worker's next call: short enough that a lost
node is noticed promptly, long enough that an idle job costs a call every couple of seconds."""

RETRY_S = 10.0
"""After an actor failed before it held a device (it could not start there), how long to wait
before asking Ray for another, so that a node that cannot start one is not asked 5× a second."""

CONNECT_S = 5.0
"""How long the daemon's start waits for a TCP answer from an explicit Ray address."""

PROBE_S = 60.0
"""How long the daemon's start waits for the nodes' probes (a fresh Ray worker process each)
to list their devices; later answers are registered as they come."""


class ClusterError(DeviceError):
    """The Ray cluster cannot be used as configured (one line naming the setting)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ClusterError("[cluster] backend = \"ray\" needs Ray: "
                           "pip install 'kernelab[ray]'") from exc
    return ray


# -- what runs on the nodes ---------------------------------------------------------------------


def gpu_devices(gpu_ids: list[Any]) -> list[Device]:
    """The GPUs Ray gave this process, as the local scheduler describes them. Ray's GPU id is a
    CUDA index (NVML's too when the node runs with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
    docs/cluster.md) or, when the node's ``CUDA_VISIBLE_DEVICES`` named UUIDs, a UUID."""
    nvml = nvml_lib.init_or_none()
    found = nvml_devices(nvml, []) if nvml is not None else []
    out = []
    for gpu_id in map(str, gpu_ids):
        match = next((d for d in found if gpu_id in (d.uuid, str(d.index))), None)
        if match is None:
            raise DeviceError(f"Ray's GPU {gpu_id!r} is not among NVML's {[d.id for d in found]}")
        out.append(match)
    return out


def node_devices(kind: str, count: int) -> list[dict[str, Any]]:
    """Every device of ``kind`` that Ray offers on the node this runs on (the inventory's
    probe, which holds them all for a moment): its GPUs, or ``count`` CPU stand-ins
    numbered ``cpu:0…``."""
    import ray

    if kind == CPU_RESOURCE:
        cpu = cpu_device()
        return [asdict(replace(cpu, id=f"cpu:{j}")) for j in range(count)]
    return [asdict(d) for d in gpu_devices(ray.get_gpu_ids())]


def node_samples(indices: list[int]) -> list[dict[str, Any]]:
    """NVML samples of this node's GPUs (by NVML index), for the head's ``gpu_samples``."""
    from kernelabd.service.devices import sample

    nvml = nvml_lib.init_or_none()
    now = time.time()
    return [] if nvml is None else [sample(nvml, Device(id=f"cuda:{i}", name="", index=i), now)
                                    for i in indices]


class WorkerGone(RuntimeError):
    """The worker process inside an actor ended (a crash of its own, not a node loss)."""


class Evaluator:
    """The Ray actor of one running device: it starts that device's worker process on its node
    and relays the worker's pipe to the daemon (``exchange``), one call at a time."""

    def __init__(self, config: Config, kind: str) -> None:
        import ray

        self.device = cpu_device() if kind == CPU_RESOURCE else gpu_devices(ray.get_gpu_ids())[0]
        self.node_id = ray.get_runtime_context().get_node_id()
        # The node's own scratch: job files are written from the store's copy, never shared.
        self.home = Home(Path(tempfile.mkdtemp(prefix="kernelab-node-")))
        self.worker = Worker(self.device)
        self.worker.start(config, self.home)

    def where(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "host": socket.gethostname(),
                "device": asdict(self.device)}

    def exchange(self, reply: tuple[str, Any] | None, wait_s: float,
                 run: int | None = None) -> tuple[str, str, tuple[Any, ...]] | None:
        """Hand the worker the daemon's ``reply`` (and a job to ``run``), then wait up to
        ``wait_s`` for its next call; None when it made none."""
        conn = self.worker.conn
        if conn is None or not self.worker.alive:
            raise WorkerGone(f"worker process exited ({self._exit_code()})")
        try:
            if run is not None:
                self.worker.assign(run)
            if reply is not None:
                conn.send(reply)
            return conn.recv() if conn.poll(wait_s) else None
        except (EOFError, OSError) as exc:
            raise WorkerGone(f"worker process exited ({self._exit_code()})") from exc

    def _exit_code(self) -> str:
        process = self.worker.process
        if process is not None:
            process.join(1.0)
        return f"exit code {process.exitcode if process is not None else None}"


# -- the daemon's side --------------------------------------------------------------------------


class RayWorker:
    """The daemon's handle on one actor: where it landed, its job, and its one pending call."""

    def __init__(self, actor: Any, pending: Any) -> None:
        self.actor = actor
        self.pending: Any = pending          # the ObjectRef of where() or of exchange()
        self.device: Device | None = None    # known once the actor is placed
        self.job_id: int | None = None

    def kill(self) -> None:
        """End the actor now; its worker dies with it (``PR_SET_PDEATHSIG``)."""
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)
        self.pending = None
        self.job_id = None


class RayScheduler(Scheduler):
    """The scheduler with workers on a Ray cluster; job commands, ``busy`` and ``worker_for``
    are the local scheduler's own."""

    def __init__(self, store: Store, recorder: LocalRecorder, config: Config, home: Home,
                 requested: str | None) -> None:
        super().__init__([], store, recorder, config, home)
        self.workers: list[RayWorker] = []  # type: ignore[assignment]
        self.ray = _ray()
        self.address = config.cluster.address
        self.connect()
        self.kind = self.unit_kind(requested)
        self.names: dict[str, str] = {}         # Ray node id → node name
        self.alive: list[str] = []              # Ray node ids alive at the last refresh
        self.inventory: dict[str, Device] = {}  # device id → device, every node's
        self.units = -1                         # devices in the live cluster; -1: not asked yet
        self.next_scan = 0.0
        self.retry_at = 0.0
        self.probing: dict[Any, str] = {}      # a probe's ObjectRef → its node id
        self.sampling: dict[Any, str] = {}     # a sampling task's ObjectRef → its node name
        self.next_sample = 0.0
        self.refresh()
        self.collect_probes(PROBE_S)

    # -- the cluster ---------------------------------------------------------------------------

    def connect(self) -> None:
        """Join the cluster as its driver, keeping the daemon's own SIGTERM/SIGINT handlers
        (``ray.init`` installs ones that exit at once, skipping the clean shutdown)."""
        self.check_reachable()
        kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.ray.init(address=self.address, log_to_driver=False, logging_level="warning",
                          namespace="kernelab")
        except Exception as exc:  # ConnectionError, a timeout, a version mismatch …
            raise ClusterError(f"[cluster] address {self.address!r}: cannot join the Ray "
                               f"cluster: {one_line(exc, 300)}") from exc
        finally:
            for sig, handler in kept.items():
                signal.signal(sig, handler)

    def check_reachable(self) -> None:
        """Refuse an explicit address nothing listens on, at once: ``ray.init`` would retry
        it for minutes before giving up."""
        if self.address == "auto":
            return
        host, _, port = self.address.removeprefix("ray://").rpartition(":")
        if not host or not port.isdigit():
            raise ClusterError(f"[cluster] address {self.address!r}: expected auto, HOST:PORT "
                               "or ray://HOST:PORT")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_S).close()
        except OSError as exc:
            raise ClusterError(f"[cluster] address {self.address!r}: no Ray head answers "
                               f"there ({one_line(exc, 300)})") from exc

    def unit_kind(self, requested: str | None) -> str:
        """``GPU`` or the CPU stand-in, chosen as ``discover`` chooses locally: ``--device``
        first, else GPUs when the cluster has any."""
        gpus = self.ray.cluster_resources().get("GPU", 0)
        if requested == "cpu":
            return CPU_RESOURCE
        if requested == "cuda" and not gpus:
            raise ClusterError(f"--device cuda: the Ray cluster at {self.address!r} has no GPU")
        return "GPU" if gpus else CPU_RESOURCE

    def refresh(self) -> None:
        """Learn new nodes and their devices (registered with their node), and how many
        devices the live cluster has now. Runs at start and every ``rescan_s``."""
        self.next_scan = time.monotonic() + self.config.daemon.rescan_s
        alive = [n for n in self.ray.nodes() if n.get("Alive")]
        for n in alive:
            self.names[n["NodeID"]] = n.get("NodeName") or n["NodeID"][:12]
        self.alive = [n["NodeID"] for n in alive]
        had, self.units = self.units, int(sum(n.get("Resources", {}).get(self.kind, 0)
                                              for n in alive))
        for n in alive:
            if n.get("Resources", {}).get(self.kind, 0) and n["NodeID"] not in \
                    self.probing.values() and not any(d.node == self.names[n["NodeID"]]
                                                      for d in self.inventory.values()):
                self.probing[self._probe(n)] = n["NodeID"]
        self.collect_probes(0)
        if not self.units and had:               # said once, when it becomes (or starts) true
            self.store.event("cluster.empty", f"the Ray cluster at {self.address!r} offers no "
                             f"{self.kind} resource yet; jobs wait", level="warning")

    def collect_probes(self, wait_s: float) -> None:
        """Register the devices of the nodes whose probes have answered (waiting up to
        ``wait_s`` for all of them); a probe waits while others hold the node's GPUs."""
        if not self.probing:
            return
        ready, _ = self.ray.wait(list(self.probing), num_returns=len(self.probing),
                                 timeout=wait_s)
        for ref in ready:
            node = self.names[self.probing.pop(ref)]
            try:
                found = self.ray.get(ref)
            except Exception as exc:
                self.store.event("cluster.probe_failed", f"node {node}: {one_line(exc, 300)}",
                                 level="warning")
                continue
            for entry in found:
                self.register(Device(**entry), node)

    def _probe(self, node: dict[str, Any]) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        count = int(node["Resources"].get(self.kind, 0))
        probe = self.ray.remote(num_cpus=0)(node_devices).options(
            num_gpus=count if self.kind == "GPU" else 0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
        return probe.remote(self.kind, count)

    def register(self, device: Device, node: str) -> Device:
        """Record a node's device under ``NODE/ID`` (ids repeat across nodes), with its node."""
        named = replace(device, id=f"{node}/{device.id}", node=node)
        self.inventory[named.id] = named
        self.store.upsert_device(named.id, named.name, uuid=named.uuid,
                                 memory_total_mb=named.memory_total_mb, node=node)
        return named

    # -- scheduling ----------------------------------------------------------------------------

    def sample(self) -> None:
        """Every ``gpu_sample_s``, each GPU node samples its GPUs through NVML (as the daemon
        does locally), so that the TUI shows every node's utilisation, clocks and power."""
        done = self.ray.wait(list(self.sampling), num_returns=len(self.sampling),
                             timeout=0)[0] if self.sampling else []
        for ref in done:
            node = self.sampling.pop(ref)
            with contextlib.suppress(Exception):  # a node gone meanwhile: its samples end
                self.store.add_gpu_samples([{**row, "device_id": f"{node}/{row['device_id']}"}
                                            for row in self.ray.get(ref)])
        if self.kind != "GPU" or time.monotonic() < self.next_sample:
            return
        self.next_sample = time.monotonic() + self.config.daemon.gpu_sample_s
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        for node_id in self.alive:
            node = self.names[node_id]
            indices = [d.index for d in self.inventory.values()
                       if d.node == node and d.index is not None]
            if indices and node not in self.sampling.values():
                task = self.ray.remote(num_cpus=0)(node_samples).options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
                self.sampling[task.remote(indices)] = node

    def schedule(self) -> None:
        """Give every placed idle actor the best queued job, then ask Ray for as many more
        actors as queued jobs remain, up to the cluster's device count."""
        if time.monotonic() >= self.next_scan:
            self.refresh()
        self.sample()
        for worker in self.workers:
            if worker.device is None or worker.job_id is not None or worker.pending is not None:
                continue
            job_id = self.store.next_queued()
            if job_id is None:
                break
            self.store.start_job(job_id, worker.device.id)
            self.store.event("job.started", f"on {worker.device.id}", job_id=job_id)
            worker.job_id = job_id
            worker.pending = worker.actor.exchange.remote(None, POLL_S, job_id)
        queued = self.store.count_jobs("queued")
        spare = [w for w in self.workers if w.job_id is None]
        while len(spare) < queued and len(self.workers) < self.units \
                and time.monotonic() >= self.retry_at:
            spare.append(self.add_worker())

    def add_worker(self) -> RayWorker:
        resources = {"num_gpus": 1} if self.kind == "GPU" else {"resources": {self.kind: 1}}
        actor_class = self.ray.remote(Evaluator).options(
            num_cpus=0, max_restarts=0, max_task_retries=0, **resources)
        actor = actor_class.remote(self.config, self.kind)
        worker = RayWorker(actor, actor.where.remote())
        self.workers.append(worker)
        return worker

    def serve(self, timeout: float) -> None:
        """Answer what the actors have sent within ``timeout`` seconds (one round)."""
        pending = {w.pending: w for w in self.workers if w.pending is not None}
        if not pending:
            time.sleep(timeout)
            return
        ready, rest = self.ray.wait(list(pending), num_returns=1, timeout=timeout)
        if rest and ready:
            ready += self.ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        for ref in ready:
            self._settle(pending[ref], ref)

    def _settle(self, worker: RayWorker, ref: Any) -> None:
        errors = self.ray.exceptions
        try:
            value = self.ray.get(ref)
        except errors.RayActorError as exc:
            self._node_lost(worker, exc)
            return
        except errors.RayTaskError as exc:
            self._worker_failed(worker, exc)
            return
        worker.pending = None
        if worker.device is None:
            self._placed(worker, value)
        elif value is None:
            if worker.job_id is not None:
                worker.pending = worker.actor.exchange.remote(None, POLL_S)
        else:
            self._answer(worker, value)

    def _placed(self, worker: RayWorker, where: dict[str, Any]) -> None:
        """The actor holds a device now: name it as the inventory does."""
        node = self.names.get(where["node_id"]) or where["host"]
        device = Device(**where["device"])
        if self.kind == CPU_RESOURCE:
            taken = {w.device.id for w in self.workers if w.device is not None}
            index = next(j for j in range(len(self.workers) + 1)
                         if f"{node}/cpu:{j}" not in taken)
            device = replace(device, id=f"cpu:{index}")
        known = self.inventory.get(f"{node}/{device.id}")
        worker.device = known or self.register(device, node)

    def _answer(self, worker: RayWorker, call: tuple[str, str, tuple[Any, ...]]) -> None:
        _, method, args = call
        try:
            if method not in RPC_METHODS:
                raise ValueError(f"unknown call {method!r}")
            reply: tuple[str, Any] = ("ok", getattr(self.recorder, method)(*args))
        except Exception as exc:
            self.store.event("daemon.error", f"{method}: {one_line(exc)}",
                             level="error", job_id=worker.job_id)
            reply = ("error", one_line(exc))
        ended = method == "end_job" and reply[0] == "ok"
        if ended:
            worker.job_id = None
        worker.pending = worker.actor.exchange.remote(reply, 0.0 if ended else POLL_S)

    def _drop(self, worker: RayWorker) -> int | None:
        job_id = worker.job_id
        worker.kill()
        self.workers.remove(worker)
        return job_id

    def _node_lost(self, worker: RayWorker, exc: Exception) -> None:
        """Ray lost the actor (its node died, or it could not be placed): the job, if any,
        goes back to the queue with its in-flight candidate pending, to go on elsewhere."""
        where = worker.device.id if worker.device is not None else "an unplaced actor"
        job_id = self._drop(worker)
        self.next_scan = 0.0
        if job_id is None:
            self.retry_at = time.monotonic() + RETRY_S
            self.store.event("cluster.actor_lost", f"{where}: {one_line(exc, 300)}", level="warning")
            return
        self.store.interrupt_job(job_id, "queued")
        self.store.event("job.node_lost", f"{where} lost mid-job ({one_line(exc, 300)}); queued "
                         "again: the in-flight candidate is evaluated again on another device",
                         level="warning", job_id=job_id)

    def _worker_failed(self, worker: RayWorker, exc: Exception) -> None:
        """The worker process itself died (its node is fine): as locally (``worker_died``)."""
        job_id = self._drop(worker)
        cause = getattr(exc, "cause", None) or exc
        if job_id is not None:
            self.worker_died(job_id, one_line(cause, 300))

    def interrupt(self, job_id: int, state: str) -> None:
        """Stop a running job now (its actor ends; the next job gets a fresh one)."""
        worker = self.worker_for(job_id)
        if worker is not None:
            self._drop(worker)
        self.store.interrupt_job(job_id, state)

    def shutdown(self) -> None:
        super().shutdown()
        self.workers.clear()
        with contextlib.suppress(Exception):
            self.ray.shutdown()
