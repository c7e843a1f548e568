"""Several nodes, one store (docs/cluster.md): three ckptfs daemons on one chunk directory and
one PostgreSQL database (a server this module starts in a temporary directory and stops at
the end) stand in for three nodes.  DDP on 4 ranks saves one checkpoint with rank r writing
through node r % 3's mount (the done markers and rank 0's completion are the only barrier, so
they cross nodes too), and FSDP2 on 3 ranks loads it through node 3's mount, each rank
reading the boxes its shards cover, element-exact against the saved state."""
import os
import shutil
import subprocess
import tempfile

import pytest
import torch

import _dist_models as M
import ckptfs
from conftest import Mount, run_ranks


class PgServer:
    """initdb + pg_ctl in a temporary directory (as "postgres" when root), Unix socket only."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ckpt-pg.")
        self.bin = subprocess.run(["pg_config", "--bindir"], capture_output=True,
                                  text=True).stdout.strip()
        if not self.bin or not os.path.exists(os.path.join(self.bin, "initdb")):
            raise RuntimeError("no PostgreSQL server programs (Debian package postgresql; "
                               "tools/setup.sh installs it)")
        self.pre = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", f"{self.dir}/data", "-A", "trust", "-U", "ckpt", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        self._run("pg_ctl", "-D", f"{self.dir}/data", "-l", f"{self.dir}/log", "-w", "-o",
                  f"-k {self.dir} -c listen_addresses= -c fsync=off", "start")

    def _run(self, prog, *args):
        subprocess.run(self.pre + [os.path.join(self.bin, prog), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def new_db(self, name):
        subprocess.run(["psql", "-X", "-q", "-h", self.dir, "-U", "ckpt", "-d", "postgres",
                        "-c", f"CREATE DATABASE {name}"], check=True)
        return f"host={self.dir} user=ckpt dbname={name}"

    def stop(self):
        subprocess.run(self.pre + [os.path.join(self.bin, "pg_ctl"), "-D", f"{self.dir}/data",
                                   "-m", "immediate", "-w", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    pg = PgServer()
    mounts = []
    try:
        meta = pg.new_db("trainer")
        for i in range(3):
            m = Mount(base / f"node{i}")
            m.store = base / "store"  # one chunk directory for every node
            m.start("-o", f"meta={meta}")
            mounts.append(m)
        yield base, mounts
    finally:
        for m in mounts:
            m.stop()
        pg.stop()


def save_over_nodes(rank, world, mnts, ref_path):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(M.make_net(5))
    opt = M.make_optim(model.module)
    M.train(model, opt, 2, rank)
    if rank == 0:
        torch.save(M.full_state(model, opt), ref_path)
    d = os.path.join(mnts[rank % len(mnts)], "ck")  # this rank's node
    ckptfs.save(d, {"model": model, "optimizer": opt, "extra_state": {"rank": rank}}).wait()
    return True


def load_fsdp2_on_node(rank, world, d, ref_path):
    ref = torch.load(ref_path)
    model = M.fsdp2(M.make_net(70 + rank))
    opt = M.make_optim(model, lr=1.0)
    st = {"model": model, "optimizer": opt, "extra_state": {}}
    ckptfs.load(d, st)
    M.assert_same_state(ref, M.full_state(model, opt), "DDP on 4 over 3 nodes -> FSDP2 on 3")
    assert st["extra_state"] == {"rank": rank}
    return True


def test_save_over_nodes_load_elsewhere(nodes):
    base, mounts = nodes
    mnts = [str(m.mnt) for m in mounts]
    ref = str(base / "ref.pt")
    run_ranks(4, save_over_nodes, mnts, ref, timeout=180)
    for m in mnts:  # the checkpoint is complete as every node sees it
        assert os.path.exists(os.path.join(m, "ck", "ckptfs-checkpoint.json")), m
        assert not os.path.exists(os.path.join(m, "ck.partial")), m
    run_ranks(3, load_fsdp2_on_node, os.path.join(mnts[2], "ck"), ref, timeout=180)
