"""ENOSPC rounds: a store on a small tmpfs filled to the last byte.

A round mounts a tmpfs (48 MiB, or 32 MiB for --short), creates a store on it, writes a few
files and fsyncs them (the reference), then fills it from two threads with random (so
incompressible) data in new files, some fsynced, and, once writes fail, with ever smaller
writes, empty files, directories and renames until every one of them fails.  Checked:

- every failure is ENOSPC (EDQUOT counts as ENOSPC; any other error is a failure);
- the daemon stays up the whole time and answers (listing, reading the reference files);
- every file whose fsync returned reads back intact, before and after the remount;
- the fillers can be deleted while the store is full; after an unmount, `ckpt gc` and a
  mount, the space is back: a file of a quarter of the tmpfs can be written, fsynced and
  read back, and `ckpt fsck` passes.
"""
import errno
import os
import shutil
import subprocess
import threading

from tlib import DEAD_ERRNOS, Daemon, Failure, MiB, log, sha

SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class EnospcSuite:
    kind = "enospc"

    def __init__(self, env, stats, tmp, short=False):
        self.env = env
        self.stats = stats
        self.dir = os.path.join(tmp, "enospc")
        self.tm = os.path.join(self.dir, "tmpfs")
        self.mnt = os.path.join(self.dir, "mnt")
        self.size = (32 if short else 48) * MiB
        self.daemon = None
        self.mounted_tmpfs = False

    def mount_tmpfs(self):
        os.makedirs(self.tm, exist_ok=True)
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", self.tm],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            raise Failure(f"cannot mount a tmpfs on {self.tm}: {p.stdout.decode().strip()}")
        self.mounted_tmpfs = True

    def umount_tmpfs(self):
        if self.mounted_tmpfs:
            subprocess.run(["umount", self.tm], stderr=subprocess.DEVNULL)
            if os.path.ismount(self.tm):
                subprocess.run(["umount", "-l", self.tm], stderr=subprocess.DEVNULL)
            self.mounted_tmpfs = False

    def round(self, rng, budget_s):
        self.mount_tmpfs()
        try:
            self.run_round(rng)
        finally:
            self.abort()
            self.umount_tmpfs()

    def run_round(self, rng):
        store = os.path.join(self.tm, "store")
        # small packs: `ckpt gc` frees a pack of dead data by deleting it, without copying; a
        # pack that mixes the fillers with live files needs free space for the live ones
        opts = ["pack_max=2M"] + (["inline_compress"] if rng.random() < 0.3 else [])
        d = self.daemon = Daemon(self.env, store, self.mnt, opts,
                                 logfile=os.path.join(self.dir, "daemon.log"))
        d.start()
        ref = {}
        ops = 0
        os.mkdir(os.path.join(self.mnt, "ref"))
        for i in range(3):
            data = rng.randbytes(rng.randrange(1, 2 * MiB))
            p = os.path.join(self.mnt, "ref", f"early{i}")
            with open(p, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            ref[f"ref/early{i}"] = sha(data)
            ops += 1
        os.mkdir(os.path.join(self.mnt, "fill"))
        errors = []
        lock = threading.Lock()
        bad = []

        def filler(t, frng):
            n = 0
            while True:
                n += 1
                rel = f"fill/t{t}_{n}"
                size = frng.choice([MiB, 4 * MiB, frng.randrange(1, 2 * MiB)])
                data = frng.randbytes(size)
                sync = frng.random() < 0.3
                try:
                    fd = os.open(os.path.join(self.mnt, rel), os.O_WRONLY | os.O_CREAT, 0o644)
                except OSError as e:
                    with lock:
                        errors.append((rel, "create", e.errno))
                    return
                err = None
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view[:MiB]):]
                    if sync:
                        os.fsync(fd)
                except OSError as e:
                    err = ("write" if view else "fsync", e.errno)
                try:
                    os.close(fd)
                except OSError as e:
                    err = err or ("close", e.errno)
                with lock:
                    if err:
                        errors.append((rel,) + err)
                    elif sync:
                        ref[rel] = sha(data)
                if err:
                    return

        frngs = [rng.__class__(rng.getrandbits(64)) for _ in range(2)]
        ths = [threading.Thread(target=filler, args=(t, frngs[t])) for t in range(2)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        ops += len(errors)
        # then smaller and smaller writes, empty files, directories, renames: all must fail
        small_ok = 0
        for k in range(400):
            what = k % 4
            rel = f"fill/s{k}"
            try:
                if what == 0:
                    with open(os.path.join(self.mnt, rel), "wb") as f:
                        f.write(rng.randbytes(rng.choice([1, 100, 4096, 65536])))
                        f.flush()
                        os.fsync(f.fileno())
                elif what == 1:
                    open(os.path.join(self.mnt, rel), "wb").close()
                elif what == 2:
                    os.mkdir(os.path.join(self.mnt, rel))
                else:
                    os.rename(os.path.join(self.mnt, "ref", "early0"),
                              os.path.join(self.mnt, "ref", "early0"))
                small_ok += 1
            except OSError as e:
                errors.append((rel, ["write", "create", "mkdir", "rename"][what], e.errno))
            ops += 1
            if not d.healthy():
                break
            if len(errors) > 60 and all(e[2] in SPACE_ERRNOS for e in errors[-20:]):
                break
        if not d.healthy():
            self.stats.fail(self.kind, f"the daemon died on a full store:\n{d.log_tail()}")
            d.kill9()
            self.daemon = None
            d = self.daemon = Daemon(self.env, store, self.mnt, opts,
                                     logfile=os.path.join(self.dir, "daemon.log"))
            d.start()
        other = [e for e in errors if e[2] not in SPACE_ERRNOS]
        for e in other[:10]:
            self.stats.fail(self.kind, f"{e[0]}: {e[1]} failed with "
                            f"{errno.errorcode.get(e[2], e[2])}, not ENOSPC")
        if not any(e[2] in SPACE_ERRNOS for e in errors):
            self.stats.fail(self.kind, "filling the store never gave ENOSPC")
        st = os.statvfs(self.tm)
        free = st.f_bavail * st.f_frsize
        lost, wrong, verified = self.check(ref, "while full")
        # the last bytes: a file outside the store takes every byte the tmpfs has left, then
        # the mount is used again; everything must fail with ENOSPC or work, the daemon must
        # stay up
        hog_ok, hog_err = self.hog(rng, d, ref)
        ops += hog_ok + len(hog_err)
        for e in hog_err:
            if e[2] not in SPACE_ERRNOS:
                self.stats.fail(self.kind, f"tmpfs full to the last byte: {e[0]}: {e[1]} "
                                f"failed with {errno.errorcode.get(e[2], e[2])}, not ENOSPC")
        hog = os.path.join(self.tm, "hog")
        if not d.healthy():
            self.stats.fail(self.kind, "the daemon died when the tmpfs was full to the last "
                            f"byte:\n{d.log_tail()}")
            d.kill9()
            os.unlink(hog)
            d = self.daemon = Daemon(self.env, store, self.mnt, opts,
                                     logfile=os.path.join(self.dir, "daemon.log"))
            d.start()
            what = "after the daemon died on the full tmpfs, space was freed and it restarted"
        else:
            what = "with the tmpfs full to the last byte"
        lo, wr, ve = self.check(ref, what)
        lost, wrong, verified = lost + lo, wrong + wr, verified + ve
        # free space: delete the fillers (maybe while full), unmount, gc, mount
        try:
            shutil.rmtree(os.path.join(self.mnt, "fill"))
        except OSError as e:
            self.stats.fail(self.kind, f"deleting files of a full store: {e}")
        for rel in [r for r in ref if r.startswith("fill/")]:
            del ref[rel]
        if os.path.exists(hog):
            os.unlink(hog)
        d.stop()
        self.daemon = None
        rc, out = self.env.ckpt_run("gc", store)
        if rc != 0:
            self.stats.fail(self.kind, f"ckpt gc after ENOSPC exited {rc}:\n{out[-1500:]}")
        d = self.daemon = Daemon(self.env, store, self.mnt, opts,
                                 logfile=os.path.join(self.dir, "daemon.log"))
        d.start()
        lo, wr, ve = self.check(ref, "after unmount, gc and mount")
        lost, wrong, verified = lost + lo, wrong + wr, verified + ve
        data = rng.randbytes(self.size // 4)
        try:
            with open(os.path.join(self.mnt, "after.bin"), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            with open(os.path.join(self.mnt, "after.bin"), "rb") as f:
                if f.read() != data:
                    wrong += 1
                    self.stats.fail(self.kind, "a file written after space came back reads "
                                    "back wrong")
            verified += 1
        except OSError as e:
            self.stats.fail(self.kind, f"after deleting the fillers and gc, writing "
                            f"{self.size // 4} bytes fails: {e}")
        d.stop()
        self.daemon = None
        rc, out = self.env.ckpt_run("fsck", store)
        if rc != 0:
            self.stats.fail(self.kind, f"ckpt fsck after ENOSPC exited {rc}:\n{out[-1500:]}")
        self.stats.add(self.kind, rounds=1, operations=ops, files_verified=verified, lost=lost,
                       wrong=wrong, enospc_errors=sum(1 for e in errors if e[2] in SPACE_ERRNOS),
                       small_ops_ok_when_full=small_ok)
        if self.env.verbose:
            log(f"  enospc: {len(errors)} failed operations ({len(other)} not ENOSPC), "
                f"{free} bytes free at the end of filling, {len(ref)} reference files")

    def hog(self, rng, d, ref):
        """Fills the tmpfs to its last byte with a file beside the store, then writes,
        creates, renames and fsyncs through the mount.  Returns (successes, failures)."""
        fd = os.open(os.path.join(self.tm, "hog"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for bs in (MiB, 64 << 10, 4096, 512, 1):
                while True:
                    try:
                        os.write(fd, bytes(bs))
                    except OSError as e:
                        if e.errno not in SPACE_ERRNOS:
                            raise
                        break
        finally:
            os.close(fd)
        ok, errs = 0, []
        for k in range(40):
            rel = f"fill/last{k}"
            what = ("write+fsync", "create", "mkdir", "rename", "fsync dir")[k % 5]
            try:
                if k % 5 == 0:
                    with open(os.path.join(self.mnt, rel), "wb") as f:
                        f.write(rng.randbytes(rng.choice([1, 4096, 1 << 20])))
                        f.flush()
                        os.fsync(f.fileno())
                elif k % 5 == 1:
                    open(os.path.join(self.mnt, rel), "wb").close()
                elif k % 5 == 2:
                    os.mkdir(os.path.join(self.mnt, rel))
                elif k % 5 == 3:
                    # a reference file there and back; the reference follows each rename that
                    # returned (the daemon may die between the two: a crash of the process
                    # keeps what it committed)
                    cur = "ref/early1" if "ref/early1" in ref else "ref/early1.tmp"
                    other = "ref/early1.tmp" if cur == "ref/early1" else "ref/early1"
                    for a, b in ((cur, other), (other, cur)):
                        os.rename(os.path.join(self.mnt, a), os.path.join(self.mnt, b))
                        ref[b] = ref.pop(a)
                else:
                    fd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                ok += 1
            except OSError as e:
                if e.errno in DEAD_ERRNOS:
                    break  # the daemon is gone: the caller reports that
                errs.append((rel, what, e.errno))
            if not d.healthy():
                break
        return ok, errs

    def check(self, ref, what):
        lost = wrong = 0
        for rel, h in sorted(ref.items()):
            try:
                with open(os.path.join(self.mnt, rel), "rb") as f:
                    got = sha(f.read())
            except OSError as e:
                lost += 1
                self.stats.fail(self.kind, f"{what}: fsynced {rel}: {e}")
                continue
            if got != h:
                wrong += 1
                self.stats.fail(self.kind, f"{what}: fsynced {rel} reads back different bytes")
        return lost, wrong, len(ref)

    def finish(self, rng):
        pass

    def abort(self):
        if self.daemon is not None:
            try:
                self.daemon.kill9()
            except Failure:
                pass
            self.daemon = None
