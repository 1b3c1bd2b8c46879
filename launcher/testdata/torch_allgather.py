"""An unmodified torch.distributed program, as a user would bring it.

init_process_group("gloo", init_method="env://") reads RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT, and rank 0 hosts torch's own TCPStore on
MASTER_PORT. Every rank all-gathers a random tensor made from a seed that
depends on the seed argument and the rank, then checks every block byte for
byte against what its sender generated, and prints "PASS rank R".

usage: torch_allgather.py [seed]
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def block(seed, rank, n):
    g = torch.Generator()
    g.manual_seed(seed * 1000003 + rank)
    return torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int64)


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    n = 1000 + 17 * world
    mine = block(seed, rank, n)
    out = [torch.empty(n, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(out, mine)
    for r in range(world):
        want = block(seed, r, n).numpy().tobytes()
        got = out[r].numpy().tobytes()
        if got != want:
            bad = next(i for i in range(len(want)) if got[i] != want[i])
            print(f"FAIL rank {rank}: block of rank {r} differs at byte {bad}", flush=True)
            sys.exit(1)
    dist.barrier()
    dist.destroy_process_group()
    print(f"PASS rank {rank}", flush=True)


if __name__ == "__main__":
    main()
