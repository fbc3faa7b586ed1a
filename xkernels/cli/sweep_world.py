"""The processes a sweep runs in: one, or the ranks ``torchrun`` starts (``torch.distributed``).

Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` set) each rank joins the default
process group with its device's collective backend (NCCL on cuda, HCCL on npu, gloo on CPU) and
selects its local device (``LOCAL_RANK``). Python objects, barriers and progress go through the
rendezvous store, never through a collective: a collective's work object keeps its tensors until
the backend's worker thread drops it, and a worker that drops Python-owned tensors while the
interpreter exits needs the GIL it can no longer take (the process aborts: "terminate called
without an active exception", seen with gloo after a ``gather_object``). Without ``torchrun`` the
world is this process alone and nothing is initialised.
"""

from __future__ import annotations

import datetime
import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

#: The collective backend of each device type (gloo for everything on the host).
COLLECTIVES = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}
#: How long a rank waits for the others (at a gather or barrier, in the store): a rank may still be sweeping.
TIMEOUT = datetime.timedelta(hours=6)
PROGRESS_KEY = "xkernels_sweep_done"
EXCHANGE_KEY = "xkernels_sweep_exchange"


@dataclass
class World:
    """This process's place in the sweep."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    _store: Any = field(default=None, repr=False)
    _counts: dict[str, int] = field(default_factory=dict, repr=False)
    _exchanges: int = field(default=0, repr=False)  # gathers and barriers so far (the same on every rank)
    _tag: str = field(default="", repr=False)  # this world's keys in the store (a process may join again)

    @property
    def distributed(self) -> bool:
        return self._store is not None

    def add_done(self, counter: str, n: int = 1) -> int:
        """Count ``n`` more finished items on ``counter`` (one per sweep); the count over every
        rank so far (this rank's alone when there is no store)."""
        if self._store is None:
            self._counts[counter] = self._counts.get(counter, 0) + n
            return self._counts[counter]
        return int(self._store.add(f"{PROGRESS_KEY}{self._tag}/{counter}", n))

    def _post(self, payload: bytes) -> str:
        """This rank's part of the next exchange; the exchange's key prefix."""
        self._exchanges += 1
        prefix = f"{EXCHANGE_KEY}{self._tag}/{self._exchanges}"
        self._store.set(f"{prefix}/{self.rank}", payload)
        return prefix

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (``None`` on the others); ``[obj]`` alone."""
        if not self.distributed:
            return [obj]
        prefix = self._post(pickle.dumps(obj))
        if self.rank != 0:
            return None
        keys = [f"{prefix}/{r}" for r in range(self.size)]
        self._store.wait(keys, TIMEOUT)
        got = [pickle.loads(self._store.get(k)) for k in keys]
        for k in keys:
            self._store.delete_key(k)
        return got

    def barrier(self) -> None:
        """Every rank reaches this line before any leaves it."""
        if self.distributed:
            prefix = self._post(b"")
            self._store.wait([f"{prefix}/{r}" for r in range(self.size)], TIMEOUT)

    def close(self) -> None:
        """Leave the process group together (a rank tearing down its connections while rank 0
        still writes would abort the others)."""
        if self.distributed:
            import torch.distributed as dist

            self.barrier()
            if dist.is_initialized():
                dist.destroy_process_group()


def join(device_type: str) -> World:
    """The world of this process: ``torchrun``'s ranks (process groups initialised, local device
    selected), else a world of one."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return World()
    import torch.distributed as dist

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type != "cpu":
        getattr(torch, device_type).set_device(local)  # before NCCL/HCCL binds a device
    if not dist.is_initialized():
        dist.init_process_group(backend=COLLECTIVES.get(device_type, "gloo"), timeout=TIMEOUT)
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    joins = int(store.add(f"{EXCHANGE_KEY}/joins/{rank}", 1))  # every rank joins as often as the others
    return World(rank, size, local, store, _tag=f"/{joins}")


class Progress:
    """One progress line for the whole sweep, written by rank 0 to stderr (redrawn in place
    on a terminal, a line every 10 s otherwise)."""

    def __init__(self, world: World, total: int, label: str) -> None:
        self.world, self.total, self.label = world, total, label
        self.counter = label
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.shown = -1.0
        self.last_final = -1
        self.failed = 0

    def resumed(self, n: int) -> None:
        """``n`` items of this rank were taken from checkpoints."""
        self.world.add_done(self.counter, n)

    def step(self, rec: dict[str, Any] | None = None) -> None:
        """One item finished on this rank (``rec``: its record)."""
        if rec is not None and "err" in rec:
            self.failed += 1
        done = self.world.add_done(self.counter, 1)
        if self.world.rank == 0:
            self.show(done, final=done >= self.total)

    def show(self, done: int, final: bool = False) -> None:
        now = time.perf_counter() - self.start
        if (not final and not self.tty and now - self.shown < 10) or (final and done == self.last_final):
            return
        self.shown = now
        if final:
            self.last_final = done
        pct = 100.0 * done / max(self.total, 1)
        bar = "#" * int(pct // 5)
        line = (f"{self.label}: [{bar:<20}] {done}/{self.total} items ({pct:.0f}%), {self.world.size} "
                f"process{'es' if self.world.size > 1 else ''}, {now:.0f} s")
        print(("\r\033[K" if self.tty else "") + line, end="\n" if final or not self.tty else "",
              file=sys.stderr, flush=True)

    def wait_for_others(self, poll_s: float = 0.5) -> None:
        """Wait until every rank's items are counted (rank 0 keeps the bar moving meanwhile), so
        that each rank's time waiting for the others is spent, and can be counted, here."""
        done = self.world.add_done(self.counter, 0)
        while self.world._store is not None and done < self.total:
            time.sleep(poll_s)
            done = self.world.add_done(self.counter, 0)
            if self.world.rank == 0:
                self.show(done)
        if self.world.rank == 0:
            self.show(done, final=True)
