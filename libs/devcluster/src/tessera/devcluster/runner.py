"""The devcluster: the emulated API server plus simulated nodes, kubelet, GPU Operator and NVML.

The simulation works on the API server's object store directly, in the server's event loop: it is
a part of the same process (as KWOK's controllers are of theirs), every change it makes goes
through the same store and reaches watchers as ordinary events, and nothing polls.

    with DevCluster.from_file("examples/clusters/dev-4x8.yaml", speed=60) as cluster:
        cluster.write_kubeconfig(".tessera/kubeconfig")
        cluster.nvml_readings("gpu-node-0")
        cluster.interrupt_spot("gpu-node-1", notice_s=30)

Checkpointable pods run simulated trainers (`tessera.devcluster.sim.trainer`) that checkpoint to
`TrainerSettings.storage_url` and, with `TrainerSettings.nats_url`, answer the checkpoint service.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tessera.cluster.cluster_file import NodeSpec, load_cluster
from tessera.devcluster import persistence
from tessera.devcluster.apiserver import NODES, ApiServer
from tessera.devcluster.apiserver.resources import DEFAULT_RESOURCES, ResourceRegistry
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.controllers import WorkloadControllers
from tessera.devcluster.sim.context import SimContext, SimSettings
from tessera.devcluster.sim.hpa import HORIZONTAL_POD_AUTOSCALERS
from tessera.devcluster.sim.http import register_http_endpoints
from tessera.devcluster.sim.kubelet import Kubelet
from tessera.devcluster.sim.nvml import DutyCycleTrace, GpuReading, NvmlModel, PodLoad
from tessera.devcluster.sim.operator_controller import GpuOperator
from tessera.devcluster.sim.podresources import PodResourcesServers
from tessera.devcluster.sim.spot import DEFAULT_NOTICE_S, SpotInterruptions, SpotNotice
from tessera.devcluster.sim.state import FaultKind, SimNode
from tessera.devcluster.sim.trainer import TrainerSettings


class UnknownNodeError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class DevCluster:
    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        *,
        settings: SimSettings | None = None,
        trainer: TrainerSettings | None = None,
        duty_cycle: DutyCycleTrace | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        history: int = 10_000,
        podresources: bool = True,
        state_file: Path | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("a devcluster needs at least one node")
        self.settings = settings or SimSettings()
        # autoscaling/v2 HPAs are served too (sim/hpa.py simulates their controller)
        registry = ResourceRegistry((*DEFAULT_RESOURCES, HORIZONTAL_POD_AUTOSCALERS))
        store = ObjectStore(history=history)
        if state_file is not None:
            # before the first write: a run before may have handed out revisions it left in no snapshot
            persistence.resume_revisions(state_file, store)
        self.apiserver = ApiServer(store=store, host=host, port=port, registry=registry)
        sim_nodes = {spec.name: SimNode.from_spec(spec, i) for i, spec in enumerate(nodes)}
        self.ctx = SimContext(self.apiserver.store, self.settings, sim_nodes, trainer or TrainerSettings())
        self.kubelet = Kubelet(self.ctx)
        self.operator = GpuOperator(self.ctx, on_node_lost=self.kubelet.node_lost)
        self.spot = SpotInterruptions(self.ctx)
        #: Jobs, JobSets, ReplicaSets, Deployments and the garbage collector
        self.controllers = WorkloadControllers(self.apiserver.store, self.apiserver.webhooks)
        self.nvml = NvmlModel(duty_cycle or DutyCycleTrace.load())
        #: the kubelet's PodResources gRPC API per node (off for very large simulated clusters)
        self.podresources = PodResourcesServers(self.ctx, host) if podresources else None
        #: where the objects and the simulated hardware are kept across restarts (see persistence.py)
        self.persister = (
            persistence.Persister(state_file, self.apiserver.store, self.ctx)
            if state_file is not None
            else None
        )
        #: how many objects came back from the state file (None: nothing was restored)
        self.restored: int | None = None
        if state_file is not None and state_file.exists():
            self.restored = persistence.restore(
                persistence.read(state_file),
                self.apiserver.store,
                registry,
                self.ctx,
                self.apiserver.emulator.serve_crd,
                state_file,
            )
        self._tasks: list[asyncio.Task[None]] = []
        self._thread_mode = False
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        register_http_endpoints(self)

    @classmethod
    def from_file(cls, path: str | Path, *, limit: int | None = None, **kwargs: Any) -> DevCluster:
        speed = kwargs.pop("speed", None)
        if speed is not None:
            kwargs["settings"] = SimSettings(speed=speed)
        return cls(load_cluster(path, limit=limit), **kwargs)

    @property
    def url(self) -> str:
        return self.apiserver.url

    @property
    def store(self) -> Any:
        return self.apiserver.store

    def write_kubeconfig(self, path: str | Path) -> Path:
        return self.apiserver.write_kubeconfig(path)

    # ---- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.apiserver.__aenter__()
        if self.podresources is not None:
            await self.podresources.start()
        self.operator.install()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.kubelet.run()), loop.create_task(self.operator.run())]
        if self.restored is not None:
            self.kubelet.resume()
        if self.persister is not None:
            self._tasks.append(loop.create_task(self.persister.run()))
        self.controllers.start()
        await asyncio.sleep(0)  # let the controllers open their watches
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.spot.stop()
        await self.controllers.stop()
        await self.kubelet.stop()
        await self.operator.stop()
        if self.podresources is not None:
            await self.podresources.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # The API server stops serving before the final snapshot: a write it acknowledged while the
        # snapshot was being taken would be lost.
        await self.apiserver.__aexit__(exc_type, exc, tb)
        if self.persister is not None:
            await self.persister.final()

    def start(self, timeout: float = 30.0) -> str:
        """Run the devcluster on a background thread with its own event loop; returns the API URL."""
        ready = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            self._stopping = asyncio.Event()
            try:
                async with self:
                    ready.set()
                    await self._stopping.wait()
            except BaseException as exc:
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=asyncio.run, args=(serve(),), name="devcluster", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError(f"the devcluster did not start within {timeout} seconds")
        if failure:
            raise RuntimeError("the devcluster failed to start") from failure[0]
        self._thread_mode = True
        return self.url

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread_mode:
            stopping, thread = self._stopping, self._thread
            assert stopping is not None and thread is not None  # set by start()
            self.apiserver.loop.call_soon_threadsafe(stopping.set)
            thread.join(timeout)
            self._thread_mode = False

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_loop(self, fn: Any, *args: Any) -> Any:
        """Run a state change on the devcluster's loop, from its own thread or any other."""
        loop = self.apiserver.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            return fn(*args)

        async def call() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), loop).result(30)

    # ---- NVML and faults ---------------------------------------------------------------------

    def node(self, name: str) -> SimNode:
        try:
            return self.ctx.nodes[name]
        except KeyError:
            raise UnknownNodeError(f"node {name!r} is not a devcluster node") from None

    def nvml_readings(self, node: str) -> list[GpuReading]:
        """What NVML would report now for each GPU of the node."""
        sim_node = self.node(node)
        now = self.ctx.clock.now()
        with self.ctx.lock:
            loads: dict[str, list[PodLoad]] = {}
            for key, devices in self.ctx.devices.items():
                if devices.node != node or not devices.running:
                    continue
                for holding in devices.holdings:
                    loads.setdefault(holding.gpu_uuid, []).append(PodLoad(key, holding, devices.profile))
            return [self.nvml.read(node, gpu, loads.get(gpu.uuid, []), now) for gpu in sim_node.gpus]

    def inject_fault(
        self,
        node: str,
        gpu: int | None,
        kind: FaultKind | str,
        code: int = 79,
        *,
        notice_s: float = DEFAULT_NOTICE_S,
    ) -> SpotNotice | None:
        """An XID error, overheating or a lost GPU on one GPU; with kind 'lost' and no GPU, the whole node;
        'spot-interruption' (no GPU): the node's notice now and its deletion `notice_s` simulated seconds on."""
        fault = FaultKind(kind)
        sim_node = self.node(node)
        if fault is FaultKind.SPOT_INTERRUPTION:
            if gpu is not None:
                raise ValueError("gpu: a spot interruption takes the whole node; give no GPU index")
            return self.interrupt_spot(node, notice_s)
        if gpu is None:
            if fault is not FaultKind.LOST:
                raise ValueError(f"gpu: a {fault.value} fault needs a GPU index")
            self._on_loop(self.operator.lose_node, node)
            return None
        if not 0 <= gpu < len(sim_node.gpus):
            raise ValueError(f"gpu: node {node} has GPUs 0..{len(sim_node.gpus) - 1}, got {gpu}")
        target = sim_node.gpus[gpu]
        with self.ctx.lock:
            if fault is FaultKind.XID:
                target.xids.append(code)
            elif fault is FaultKind.OVERHEATING:
                target.overheating = True
            else:
                target.lost = True
        self._on_loop(self.operator.reconcile, node)
        return None

    def interrupt_spot(self, node: str, notice_s: float = DEFAULT_NOTICE_S) -> SpotNotice:
        """Taint the node as the AWS Node Termination Handler does on a spot interruption notice, and
        delete it when the notice (simulated seconds) runs out; raises `SpotInterruptionError` when the
        node already has a notice or is gone."""
        self.node(node)
        notice: SpotNotice = self._on_loop(self.spot.interrupt, node, notice_s)
        return notice

    def clear_faults(self, node: str) -> None:
        """Clear the GPU faults, bring a lost node back, and withdraw a pending spot interruption notice;
        a node already deleted (its spot notice ran out, or kubectl deleted it) stays gone."""
        sim_node = self.node(node)
        self._on_loop(self.spot.cancel, node)
        if self.store.find(NODES, None, node) is None:
            raise ValueError(f"node {node} was deleted; a deleted node does not come back")
        with self.ctx.lock:
            for gpu in sim_node.gpus:
                gpu.clear_faults()
        if sim_node.lost:
            self._on_loop(self.operator.restore_node, node)
        else:
            self._on_loop(self.operator.reconcile, node)
