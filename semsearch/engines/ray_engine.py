"""The Ray engine: Ray Data reads and chunks files in tasks, encodes them in an actor pool (one
model replica per actor: a GPU each where the cluster has GPUs, else CPU actors) and writes the
rows with their vectors as Parquet shards into the staging folder; then Ray tasks turn groups of
shards into finished index segments in parallel (engines/build.py), with the ids the driver
assigned, so the driver only publishes the manifest.

The staging folder and the corpus must be reachable by every worker at the same path: on one
machine they are; on a cluster, put both on shared storage. Ray retries a task or an actor that
dies (its process killed, its node lost): the driver still gets every chunk exactly once, and
checks it (engines/build.py).
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from semsearch.engines.spec import EncodeSpec, FileJob
from semsearch.engines.work import chunk_file, embed_table, encoder_for, maybe_die, offsets_for
from semsearch.errors import InputError, SemsearchError

log = logging.getLogger(__name__)

CPU_ACTOR_CPUS = 0.75
LIGHT_TASK_CPUS = 0.125


def import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:
        raise InputError("--engine ray needs Ray Data: pip install 'semsearch[ray]'") from e
    return ray


def _chunk_task(job: dict, spec: EncodeSpec) -> list[dict]:
    return chunk_file(job, spec, offsets_for(spec))


AUTH_MARKERS = ("InvalidAuthToken", "Unauthenticated", "authentication token", "AuthenticationError")


def _auth_refused(exc: BaseException) -> bool:
    """Whether a failed ray.init() was the cluster refusing this process for want of its token.

    Ray (2.52+) with token authentication on (`ray start` turns it on where a token file exists)
    refuses a driver that sends no token or the wrong one. ray.init() then retries for about 20 s
    and raises ConnectionError("Failed to connect to Ray cluster at ..."), whose cause is a
    RuntimeError carrying the last attempt's traceback: ray.exceptions.AuthenticationError
    ("RPC error: InvalidAuthToken: Authentication token is missing or incorrect")."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ == "AuthenticationError" or any(m in str(getattr(e, "message", "") or e) for m in AUTH_MARKERS):
            return True
        e = e.__cause__ or e.__context__
    return False


def connect_error(address: str | None, exc: BaseException) -> InputError:
    """The error to show for a ray.init() that failed with `exc`: what to set when the cluster
    wants a token, else Ray's own first line."""
    where = f"the Ray cluster at {address!r}" if address else "a new local Ray cluster"
    if _auth_refused(exc):
        tokens = ("the cluster's token in RAY_AUTH_TOKEN, or in a file named by RAY_AUTH_TOKEN_PATH "
                  "(default ~/.ray/auth_token; `ray get-auth-token` on the head node prints it)")
        if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
            return InputError(f"{where} refused this process's token (token authentication): set {tokens}")
        return InputError(f"{where} uses token authentication and this process sent no token: "
                          f"set RAY_AUTH_MODE=token and {tokens}")
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return InputError(f"cannot connect to {where}: {first}")


@contextlib.contextmanager
def _ray_errors():
    """Errors from Ray as semsearch errors: a worker's SemsearchError as itself, others named."""
    try:
        yield
    except SemsearchError:
        raise
    except Exception as e:  # noqa: BLE001 - Ray wraps worker errors in many types
        cause = getattr(e, "cause", None) or e.__cause__
        if isinstance(cause, SemsearchError):
            raise cause from e
        raise SemsearchError(f"the Ray run failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e


class EmbedActor:
    """One model replica: encodes batches of rows (pyarrow tables) on its GPU or CPU."""

    def __init__(self, spec: EncodeSpec, device: str, marker: str, kill_once_after: int | None = None):
        import torch

        if device == "cpu":
            torch.set_num_threads(1)  # one core an actor: N actors on N cores, no oversubscription
        self.spec, self.marker, self.kill_once_after = spec, Path(marker), kill_once_after
        self.encoder = encoder_for(spec, device)
        self.batches = 0

    def __call__(self, table):
        maybe_die(self.kill_once_after, self.batches, self.marker)
        self.batches += 1
        return embed_table(table, self.encoder, self.spec.keep_states)


class RayEngine:
    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None, num_cpus: int | None = None,
                 batch_rows: int = 256, progress: bool = False, kill_once_after: int | None = None):
        if workers is not None and workers < 1:
            raise InputError(f"--workers must be at least 1, got {workers}")
        self.address = address
        self.workers = workers
        self.num_cpus = num_cpus  # a new local cluster's CPUs (None: all of this machine's)
        self.batch_rows = batch_rows
        self.progress = progress
        self.kill_once_after = kill_once_after  # tests only: one actor SIGKILLs itself after n batches
        self._started = False  # this engine started the cluster: close() shuts it down

    def connect(self) -> tuple[object, bool]:
        """Ray, connected (to `address`, or a new local cluster); True if this call started it."""
        ray = import_ray()
        if ray.is_initialized():
            return ray, False
        # No address: a new local cluster, even where `ray start` left one running on this machine
        # (ray.init() would join that one and then refuse num_cpus).
        kwargs = {"address": self.address} if self.address else {"address": "local", "num_cpus": self.num_cpus}
        try:
            ray.init(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False, **kwargs)
        except (ConnectionError, ValueError, RuntimeError, ray.exceptions.RayError) as e:
            raise connect_error(self.address, e) from e
        return ray, True

    def run(self, jobs: list[FileJob], spec: EncodeSpec, staging: Path) -> dict:
        """Read, chunk and encode into staged shards. A cluster this call starts stays up for
        write_segments(), until close()."""
        t0 = time.perf_counter()
        ray, started = self.connect()
        self._started = self._started or started
        t_up = time.perf_counter() - t0
        with _ray_errors():
            figures = self._run(ray, jobs, spec, Path(staging))
        figures.update(startup_seconds=round(t_up, 2), seconds=round(time.perf_counter() - t0, 2))
        return figures

    def write_segments(self, fn, tasks: list[dict]) -> list:
        """fn(task) for every task as Ray tasks in parallel (the segment writers, engines/build.py),
        results in task order."""
        ray, started = self.connect()
        self._started = self._started or started
        with _ray_errors():
            remote = ray.remote(num_cpus=LIGHT_TASK_CPUS * 4, max_retries=2)(fn)
            return ray.get([remote.remote(t) for t in tasks])

    def close(self) -> None:
        if self._started:
            import ray

            ray.shutdown()
            self._started = False

    def _run(self, ray, jobs: list[FileJob], spec: EncodeSpec, staging: Path) -> dict:
        from ray.data import ActorPoolStrategy, DataContext

        ctx = DataContext.get_current()
        ctx.enable_progress_bars = self.progress
        res = ray.cluster_resources()
        gpus = int(res.get("GPU", 0))
        cpus = int(res.get("CPU", 1))
        workers = self.workers or (gpus if gpus else max(1, cpus - 1))
        if gpus and workers > gpus:
            raise InputError(f"--workers {workers}: the cluster has {gpus} GPU(s), one an actor")
        if not gpus and workers * CPU_ACTOR_CPUS + LIGHT_TASK_CPUS > cpus:
            raise InputError(f"--workers {workers}: the cluster has {cpus} CPU(s), about one an actor")
        device = "cuda" if gpus else "cpu"
        staging.mkdir(parents=True, exist_ok=True)
        out = staging / "shards"
        # Logical CPUs, for scheduling only: a CPU actor holds 0.75 (it runs torch on one thread),
        # reading/chunking and Parquet writes are light and take 0.125 a task, so that N actors on
        # N cores still leave room for them (with a whole CPU each, 2 actors on 2 CPUs deadlock).
        items = [{"seq": j.seq, "path": j.path, "old_hash": j.old_hash or ""} for j in jobs]
        ds = ray.data.from_items(items, override_num_blocks=max(1, min(len(items), 4 * workers)))
        ds = ds.flat_map(_chunk_task, fn_kwargs={"spec": spec}, num_cpus=LIGHT_TASK_CPUS)
        ds = ds.map_batches(
            EmbedActor, fn_constructor_kwargs={"spec": spec, "device": device, "marker": str(staging / "killed"),
                                               "kill_once_after": self.kill_once_after},
            batch_size=self.batch_rows, batch_format="pyarrow", compute=ActorPoolStrategy(size=workers),
            num_gpus=1 if gpus else 0, num_cpus=1 if gpus else CPU_ACTOR_CPUS,
        )  # Ray Data restarts a dead actor and re-runs its batches (max_restarts=-1, max_task_retries=-1 by default)
        ds.write_parquet(str(out), ray_remote_args={"num_cpus": LIGHT_TASK_CPUS})
        shards = len(list(out.glob("*.parquet"))) if out.is_dir() else 0
        marker = staging / "killed"
        return {"engine": self.name, "workers": workers, "device": device, "shards": shards,
                "killed_pid": int(marker.read_text()) if marker.exists() else None}
