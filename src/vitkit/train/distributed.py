"""Data-parallel training under torchrun: NCCL on GPUs, gloo on CPUs.

Every rank draws the same global batch (order and augmentation come from shared seeds) and
trains on its slice of it; DDP averages the gradients, so N processes follow the same
trajectory as one process with the whole batch. Rank 0 alone writes files.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..machine import launcher_number


@dataclass
class DistInfo:
    world: int
    rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup() -> DistInfo:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK), if any."""
    world, local_rank = launcher_number("WORLD_SIZE", 1, least=1), launcher_number("LOCAL_RANK", 0)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():  # joined once per process: a second join waited for ever
        if _ended["group"]:  # (joining again raced the old group's store: "another process stopped", 3 of 8)
            raise RuntimeError("a run that stopped under torchrun ended this process's part in the job (its process "
                               "group, which its other processes may have left): start the job again")
        dist.init_process_group("nccl" if cuda else "gloo")
        atexit.register(_leave)
    rank = dist.get_rank() if world > 1 else 0
    return DistInfo(world, rank, device)


def sum_tensor(info: DistInfo, t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the ranks (in place under DDP; one all-reduce)."""
    if info.world > 1:
        dist.all_reduce(t)
    return t


def broadcast(info: DistInfo, obj: Any) -> Any:
    """Rank 0's value of ``obj`` on every rank."""
    if info.world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def cleanup(info: DistInfo, finished: bool = True) -> None:
    """A run's end: a barrier where every rank finished, the group kept for the process's next run (train()
    called again: joining a second time waited for ever in init_process_group); where this rank stopped early (a
    signal, an error) the group ends now, without a barrier: the others wait in a step's all-reduce, never at
    the barrier, and both waited for ever (torchrun and both ranks stayed after SIGTERM to one). Its end ends
    the others' all-reduce."""
    if info.world > 1 and dist.is_initialized():
        if finished:
            dist.barrier()
        else:
            dist.destroy_process_group()
            _ended["group"] = True


#: whether this process ended its process group after a stop (a later run cannot join the job again)
_ended = {"group": False}


def _leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


#: what gloo and NCCL say when another process of the job went away mid-collective
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
             "ProcessGroupNCCL's watchdog", "Socket Timeout", "Connection refused")


class PeerLost(ConnectionError):
    """Another process of a torchrun job stopped (a signal, an error, a kill): this one's collective lost it."""


def peer_lost(info: DistInfo, e: BaseException) -> bool:
    """Whether ``e`` is another process's stop as a collective of this one saw it (gloo's or NCCL's words)."""
    return info.world > 1 and isinstance(e, RuntimeError) and any(words in str(e) for words in PEER_LOST)
