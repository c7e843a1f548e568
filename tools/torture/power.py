"""Power-loss rounds: every write that was not synced is dropped (or torn), then the store
must mount, hold every file the power model of workload.py says survives, pass `ckpt fsck`.

A round copies the store (the base), mounts it with the shim logging the daemon's I/O on the
store (tools/torture/shim.c) and the client's events in the same log, runs the crash workload
in a new directory rN/, and kills the daemon.  It then builds two crash states with
powerlog.replay, each at a random record of the log after the workload started (half of them
right after a completed sync): one in "drop" mode (every write and name change not yet synced
is gone) and one in "torn" mode (unsynced changes kept whole, partly or not at all, names up
to a random point after the last directory fsync).  Each is mounted and checked: rN/ against
the events logged before the cut, earlier rounds' directories against the state they were
found in.  Then it is unmounted (the daemon must exit 0), `ckpt fsck` must pass, and the last
one becomes the store of the next round.
"""
import os
import shutil
import time

import powerlog
import workload
from crash import KEEP, compare_refs, dir_bytes
from tlib import Ctl, Daemon, Failure, fsync_dir, log, tree_state

GC_ABOVE = 256 << 20  # run `ckpt gc` on the base when its packs pass this many bytes


class PowerSuite:
    kind = "power"

    def __init__(self, env, stats, tmp, threads=4, short=False):
        self.short = short
        self.env = env
        self.stats = stats
        self.dir = os.path.join(tmp, "power")
        os.makedirs(self.dir, exist_ok=True)
        self.store = os.path.join(self.dir, "store")
        self.mnt = os.path.join(self.dir, "mnt")
        self.threads = threads
        self.refs = {}
        self.n = 0
        self.daemon = None
        self.created = False

    def _daemon(self, store, shim=None, opts=()):
        self.daemon = Daemon(self.env, store, self.mnt, opts,
                             logfile=os.path.join(self.dir, "daemon.log"), shim=shim)
        return self.daemon

    def create(self):
        self._daemon(self.store).start()
        self.daemon.stop()
        self.daemon = None
        self.created = True

    def round(self, rng, budget_s):
        """Two power losses (one with --short), each checked at two cuts."""
        for _ in range(1 if self.short else 2):
            self.one(rng, budget_s)

    def one(self, rng, budget_s):
        if not self.created:
            self.create()
        self.n += 1
        rel = f"r{self.n}"
        if dir_bytes(os.path.join(self.store, "packs")) > GC_ABOVE:
            rc, out = self.env.ckpt_run("gc", self.store)
            if rc != 0:
                raise Failure(f"ckpt gc of the power store exited {rc}:\n{out}")
        base = os.path.join(self.dir, "base")
        shutil.rmtree(base, ignore_errors=True)
        subprocess_copy(self.store, base)
        inos = powerlog.base_inodes(self.store)
        logpath = os.path.join(self.dir, "io.log")
        if os.path.exists(logpath):
            os.unlink(logpath)
        ctl = Ctl(os.path.join(self.dir, "ctl"))
        opts = ["pack_max=" + rng.choice(["1M", "4M", "64M"])]
        if rng.random() < 0.25:
            opts.append("inline_compress")
        d = self._daemon(self.store, {"TORTURE_LOG": logpath, "TORTURE_CTL": ctl.path}, opts)
        d.start()
        while len(self.refs) > KEEP:
            old = min(self.refs, key=lambda r: int(r[1:]))
            shutil.rmtree(os.path.join(self.mnt, old))
            del self.refs[old]
        fsync_dir(self.mnt)
        events = workload.Events(logpath)
        wl = workload.Workload(self.mnt, rel, self.threads, rng, events, d)
        wl.start()
        time.sleep(rng.uniform(0.4, max(0.5, min(2.5, budget_s))))
        d.kill9()
        wl.killed.set()
        wl.join()
        events.close()
        self.daemon = None
        for e in wl.errors:
            self.stats.fail(self.kind, f"round {rel}: error while the daemon ran: {e}")
        for m in wl.wrong_live:
            self.stats.fail(self.kind, f"round {rel}: {m}")
        self.stats.add(self.kind, rounds=1, operations=wl.ops, files_verified=wl.live_verified,
                       wrong=len(wl.wrong_live))

        lg = powerlog.Log(logpath)
        try:
            clients = lg.clients()
            if not clients:
                raise Failure(f"round {rel}: the log holds no client event")
            first = clients[0]
            syncs = [i + 1 for i, r in enumerate(lg.recs)
                     if r.type == powerlog.R_SYNC_END and i > first]
            final = None
            all_ok = True
            for mode in ("drop", "torn"):
                if syncs and rng.random() < 0.5:
                    cut = rng.choice(syncs)
                else:
                    cut = rng.randint(first + 1, len(lg.recs))
                out = os.path.join(self.dir, f"crash-{mode}")
                shutil.rmtree(out, ignore_errors=True)
                st = powerlog.replay(lg, base, inos, out, cut, mode, rng)
                upto = sum(1 for c in clients if c < cut)
                ok = self.check(out, rel, events, upto, f"{rel} {mode} cut {cut}/{len(lg.recs)}")
                self.stats.add(self.kind, **{f"cuts_{mode}": 1, "records_replayed": st["records"],
                                             "writes_dropped": st["dropped"],
                                             "writes_torn": st["torn"]})
                if self.env.verbose:
                    log(f"  power {rel} {mode}: cut {cut}/{len(lg.recs)} (client events "
                        f"{upto}/{len(events.list)}) {st}")
                if not ok:
                    all_ok = False
                    keep = os.path.join(self.dir, f"failed-{rel}-{mode}")
                    shutil.rmtree(keep, ignore_errors=True)
                    os.makedirs(keep)
                    subprocess_copy(base, os.path.join(keep, "base"))
                    shutil.copy(logpath, os.path.join(keep, "io.log"))
                    log(f"  power: kept the base and the log of the failed cut in {keep} "
                        f"(cut {cut}, mode {mode})")
                final = out
        finally:
            lg.close()
        # the last crash state is the next round's store (after a failure: the store as the
        # kill -9 left it, and no reference state for rN/)
        if all_ok:
            shutil.rmtree(self.store)
            os.rename(final, self.store)
            self.refs[rel] = self.last_state
        for p in (base, logpath, os.path.join(self.dir, "crash-drop"),
                  os.path.join(self.dir, "crash-torn")):
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.exists(p):
                os.unlink(p)

    def check(self, store, rel, events, upto, what):
        """Mounts the crash state store, checks it, unmounts, fscks. True when all passed."""
        nfail = len(self.stats.failures)
        d = self._daemon(store)
        try:
            d.start()
        except Failure as e:
            self.stats.fail(self.kind, f"{what}: the crash state does not mount: {e}")
            return False
        v, lost, wrong, msgs = workload.verify_tree(self.mnt, rel, events, "power", upto)
        self.stats.add(self.kind, files_verified=v, lost=lost, wrong=wrong)
        for m in msgs:
            self.stats.fail(self.kind, f"{what}: {m}")
        compare_refs(self.mnt, self.refs, self.kind, self.stats)
        self.last_state = tree_state(os.path.join(self.mnt, rel))
        d.stop()
        self.daemon = None
        rc, out = self.env.ckpt_run("fsck", store)
        if rc != 0:
            self.stats.fail(self.kind, f"{what}: ckpt fsck exited {rc}:\n{out[-2000:]}")
        return len(self.stats.failures) == nfail

    def finish(self, rng):
        pass

    def abort(self):
        if self.daemon is not None:
            try:
                self.daemon.kill9()
            except Failure:
                pass
            self.daemon = None


def subprocess_copy(src, dst):
    import subprocess
    subprocess.run(["cp", "-a", "--reflink=auto", src, dst], check=True)
