"""`semsearch serve --engine ray`: the index served by a Ray Serve application, sharded for size
and replicated for load (the extra `semsearch[ray]`; imported only by this command).

    router (ingress, the same HTTP API as `semsearch serve`: serve.create_app over a ShardedService)
      └── shard-0 .. shard-N-1, each R replicas (semsearch.shards.Shard: its segments' vectors and postings)

Every node must see the index folder at the same path (shared storage). The router holds the query
encoder and the manifest; a search is a few fan-out rounds, each one call of one replica of every
shard (semsearch/shards.py says which). Ray Serve replaces a replica that dies; a call that fails
because its replica died (or stopped answering within CALL_TIMEOUT_S) is sent again, and Serve
routes it to a live replica of the same shard, so a client sees no error while one replica of each
shard lives. With a whole shard down the router answers 503 naming the shard: never silently partial.

Writes stay single-writer: the router publishes each new generation as the one-process server does;
a search names its generation, a replica that has not opened it yet opens it, and one that has moved
on answers Stale, so the router searches again on the newest: no answer mixes two generations.
"""
from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import time
from typing import Any, Iterable, NamedTuple

from semsearch.errors import SemsearchError

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 120.0  # one shard call (a busy 2-core machine answers in milliseconds; a dead replica never)
RETRIES = 8  # per shard call, with RETRY_WAIT_S between: Serve starts a new replica meanwhile
PROXY_READY_S = 60  # seconds Ray Serve's HTTP proxy may take to start (its default: 5)
RETRY_WAIT_S = 0.5
LOOPBACK_ENV = "SEMSEARCH_RAY_LOOPBACK"  # set for a local cluster kept on loopback (local_cluster_on_loopback)


class ShardUnavailable(SemsearchError):
    """No replica of a shard answered (HTTP 503)."""


class StaleAnswer(NamedTuple):
    """A shard's Stale, returned by its replica rather than raised, and raised again by the
    router. Stale is the protocol's expected answer while a generation is being published (the
    router searches again on the newest), but Ray Serve logs every exception a replica raises as a
    failed request, at ERROR with its traceback: operators saw stack traces for a normal event."""

    message: str
    generation: int


def _require():
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as e:
        raise ImportError(f"`semsearch serve --engine ray` needs Ray Serve ({e.name} is missing): "
                          "pip install 'semsearch[ray]'") from e


def ray_fanout(handles: list) -> Any:
    """A fanout (semsearch.shards) over Ray Serve deployment handles, one per shard: every shard's
    call is sent first, then each answer awaited; a call whose replica died is sent again."""
    import ray.exceptions

    from semsearch.shards import Stale

    def one(i: int, handle, method: str, args: tuple, first):
        response = first
        for attempt in range(RETRIES):
            try:
                if response is None:
                    response = handle.call.remote(method, *args)
                got = response.result(timeout_s=CALL_TIMEOUT_S)
                if isinstance(got, StaleAnswer):
                    raise Stale(got.message, got.generation)
                return got
            except (Stale, SemsearchError):
                raise
            except ray.exceptions.RayTaskError as e:  # the shard's own error: pass it on as itself
                cause = getattr(e, "cause", None)
                if isinstance(cause, SemsearchError):
                    raise cause from None
                if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
                    raise
                log.warning("shard %d: %s (attempt %d), trying another replica", i, type(e).__name__, attempt + 1)
            except (ray.exceptions.RayError, TimeoutError) as e:
                log.warning("shard %d: %s (attempt %d), trying another replica", i, type(e).__name__, attempt + 1)
            response = None
            time.sleep(RETRY_WAIT_S)
        raise ShardUnavailable(f"shard {i} of {len(handles)} has no replica that answers (tried {RETRIES} times): "
                               "the index cannot be searched whole; no partial answer is given")

    def fanout(method: str, *args):
        sent = []
        for h in handles:
            try:
                sent.append(h.call.remote(method, *args))
            except Exception:  # noqa: BLE001 - sent again in one()
                sent.append(None)
        return [one(i, h, method, args, r) for i, (h, r) in enumerate(zip(handles, sent))]

    return fanout


def build_app(index, shards: int = 1, replicas: int = 1, *, device: str = "cpu", limits=None, read_only: bool = False,
              api_key: str | None = None, host: str = "127.0.0.1", allowed_hosts: Iterable[str] = (),
              num_cpus: float = 0.0, encoder=None):
    """The Ray Serve application (not yet run): `shards` shard deployments of `replicas` replicas
    each, and the router, which serves semsearch's HTTP API. `num_cpus`: what each replica reserves
    from Ray (0: they share the machine's CPUs, for small clusters). `encoder`: a callable the
    router calls for its query encoder (benchmarks' stand-in encoders); None: the index's model."""
    _require()
    from ray import serve

    from semsearch.store.folder import index_path
    from semsearch.store.manifest import Manifest

    folder = str(index_path(index).resolve())
    Manifest.load(folder)  # a missing or damaged index fails here, before any replica starts
    if shards < 1 or replicas < 1:
        from semsearch.errors import InputError

        raise InputError(f"--shards and --replicas must be at least 1, got {shards} and {replicas}")

    @serve.deployment(ray_actor_options={"num_cpus": num_cpus}, max_ongoing_requests=64, health_check_period_s=2,
                      health_check_timeout_s=30, graceful_shutdown_timeout_s=5)
    class ShardReplica:
        def __init__(self, folder: str, i: int, n: int, device: str):
            from semsearch.shards import Shard

            replica_grpc_on_loopback()
            self.shard = Shard(folder, i, n, device)

        def call(self, method: str, *args):
            from semsearch.shards import Stale

            try:
                return self.shard.call(method, *args)
            except Stale as e:
                return StaleAnswer(str(e), e.generation)

    @serve.deployment(ray_actor_options={"num_cpus": num_cpus}, max_ongoing_requests=256)
    @serve.ingress()
    class Router:
        def __init__(self, folder: str, handles: list, device: str, limits, read_only: bool, api_key, host: str,
                     allowed_hosts: list[str], encoder):
            from semsearch.serve import create_app
            from semsearch.service import ShardedService

            replica_grpc_on_loopback()
            service = ShardedService(folder, ray_fanout(handles), device=device, encoder=encoder() if encoder else None)
            self._asgi = create_app(service, limits, read_only,
                                  api_key=api_key, host=host, allowed_hosts=allowed_hosts)

        def __serve_build_asgi_app__(self):
            return self._asgi

    handles = [ShardReplica.options(name=f"shard-{i}", num_replicas=replicas).bind(folder, i, shards, device)
               for i in range(shards)]
    return Router.options(name="router").bind(folder, handles, device, limits, read_only, api_key, host, list(allowed_hosts),
                                              encoder)


def serve_ray(index=None, host: str = "127.0.0.1", port: int = 8000, *, shards: int = 1, replicas: int = 1,
              ray_address: str | None = None, device: str = "cpu", limits=None, read_only: bool = False,
              api_key: str | None = None, insecure: bool = False, allowed_hosts: Iterable[str] = ()) -> None:
    """Start (or join, `ray_address`) a Ray cluster, run the application, and serve until
    interrupted (Ctrl-C or SIGTERM: the application and a cluster this call started are shut down,
    and it returns). A new local cluster on a loopback `host` binds its own ports (GCS, raylet,
    workers, replicas) to loopback too (local_cluster_on_loopback)."""
    address = ray_address or os.environ.get("RAY_ADDRESS") or None
    if address is None:  # the HTTP proxy of a new local cluster listens here: a taken port fails now, clearly
        _check_port(host, port)
    if address is None and _is_loopback(host):
        local_cluster_on_loopback()
    _require()
    import ray
    from ray import serve

    from semsearch.exposure import check_api_key, check_exposure

    if api_key is not None:
        api_key = check_api_key(api_key)
    check_exposure(host, api_key, insecure)
    app = build_app(index, shards, replicas, device=device, limits=limits, read_only=read_only, api_key=api_key,
                    host=host, allowed_hosts=allowed_hosts)
    # Ray Serve gives its HTTP proxy 5 s to report ready, three times, then kills it: on a busy
    # machine a new proxy's imports alone take longer (seen on 2 loaded cores). A new local
    # cluster's processes inherit this; a cluster joined keeps its own setting.
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", str(PROXY_READY_S))
    ray.init(address=address, include_dashboard=False)
    previous = signal.signal(signal.SIGTERM, _sigterm_stops)  # (ray.init sets one that exits mid-call)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(app, name="semsearch", route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        log.warning("stopping: the application and its replicas are shut down")
    finally:
        signal.signal(signal.SIGTERM, previous)
        with contextlib.suppress(Exception):  # (a cluster that is already gone)
            serve.shutdown()
        ray.shutdown()


def _check_port(host: str, port: int) -> None:
    """An InputError naming --port where host:port cannot be listened on (Ray Serve's proxy would
    fail only after the cluster started, ~20 s later, with a RuntimeError from inside Ray)."""
    import socket

    from semsearch.errors import InputError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy binds: a port in TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as e:
            raise InputError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror or e}); "
                             "another server may be using it") from e


def _sigterm_stops(signum, frame) -> None:
    """SIGTERM as Ctrl-C: serve_ray shuts down what it started and returns (exit status 0),
    where Ray's own handler exited from inside whatever call was running, with a stack dump."""
    raise KeyboardInterrupt


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def local_cluster_on_loopback() -> None:
    """Make the local Ray cluster this process starts bind its ports to loopback. Ray (2.5x)
    binds a node's servers to its node IP, which it resolves to a reachable interface even when
    asked for 127.0.0.1 (resolve_ip_for_localhost) unless clusters are off
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read when Ray is imported): then the node IP is
    loopback, and so is every server's address. Must run before `import ray`; where Ray is
    already imported, its constant is set the same way. Not for a multi-node cluster (serve
    --ray-address joins one, and keeps its addresses)."""
    import sys

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ[LOOPBACK_ENV] = "1"  # the cluster's processes inherit it: replica_grpc_on_loopback
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def replica_grpc_on_loopback() -> None:
    """In a Ray Serve replica of a loopback cluster (local_cluster_on_loopback): its
    inter-deployment gRPC server listens on loopback, not on every interface. Ray Serve (2.5x)
    binds that server to "[::]:0" with no setting to change it (serve/_private/replica.py,
    `_on_initialized`, which runs after the deployment's constructor, where this is called), so
    the address is rewritten where the replica module asks for the port. Private API: where
    it is gone this does nothing, and tests/test_serve_ray.py, which lists every listening
    socket of the process tree, fails."""
    if os.environ.get(LOOPBACK_ENV) != "1":
        return
    try:
        from ray.serve._private import replica
    except ImportError:
        return
    real = getattr(replica, "add_port_to_grpc_server", None)
    if real is None or getattr(real, "on_loopback", False):
        return

    def add_port(server, address: str, *args, **kwargs):
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address[len("[::]:"):]
        return real(server, address, *args, **kwargs)

    add_port.on_loopback = True
    replica.add_port_to_grpc_server = add_port
