"""Damage rounds: one flipped byte in a pack or in the metadata engine's files.

A pristine store with a known file set (random and compressible files, small and large,
sparse) is made once.  Each trial copies it, flips one byte at a random offset of one of its
files, mounts the copy and reads every file in 64 KiB preads and whole: each read must return
the right bytes or fail with EIO (never other bytes, never another error); the daemon must
stay up and unmount cleanly; `ckpt fsck` must name every file that gave EIO.

Packs (a flip in the 64-byte pack header 15% of the time, in a record's 48-byte header 15%,
anywhere else 70%): the damaged store must mount.  The index (RocksDB's SST, MANIFEST,
CURRENT, WAL, OPTIONS, IDENTITY) and the store marker: a store that then refuses to mount is
counted (`unmountable`; issue 22 makes `ckpt repair` bring such stores back) but is not a
failure of this check; one that mounts must serve no wrong byte, and a file it no longer
lists is counted as `missing` (not served wrong).  When `ckpt repair` exists, this is where its check belongs.
"""
import errno
import os
import shutil

from tlib import Daemon, Failure, MiB, copy_tree, log

BLOCK = 64 << 10


class DamageSuite:
    kind = "damage"

    def __init__(self, env, stats, tmp, short=False):
        self.env = env
        self.stats = stats
        self.dir = os.path.join(tmp, "damage")
        os.makedirs(self.dir, exist_ok=True)
        self.pristine = os.path.join(self.dir, "pristine")
        self.mnt = os.path.join(self.dir, "mnt")
        self.trials = 4 if short else 8
        self.files = None
        self.daemon = None

    def make_pristine(self, rng):
        self.files = {}
        d = Daemon(self.env, self.pristine, self.mnt,
                   logfile=os.path.join(self.dir, "daemon.log"))
        self.daemon = d
        d.start()
        os.mkdir(os.path.join(self.mnt, "dir"))
        specs = [("random", rng.randrange(1, 5 * MiB)) for _ in range(6)]
        specs += [("text", rng.randrange(1, 3 * MiB)) for _ in range(3)]
        specs += [("small", rng.randrange(0, 5000)) for _ in range(4)]
        specs += [("sparse", 4 * MiB)]
        for i, (how, n) in enumerate(specs):
            if how == "text":
                line = b"step=%d loss=0.%d lr=3e-4 tokens=%d\n"
                data = b"".join(line % (k, k * 7919 % 1000, k * 4096) for k in range(n // 30 + 1))
                data = data[:n]
            elif how == "sparse":
                data = bytearray(n)
                data[3 * MiB:3 * MiB + 5000] = rng.randbytes(5000)
                data = bytes(data)
            else:
                data = rng.randbytes(n)
            rel = f"dir/{how}{i}.bin" if i % 2 else f"{how}{i}.bin"
            with open(os.path.join(self.mnt, rel), "wb") as f:
                f.write(data)
            self.files[rel] = data
        d.stop()
        self.daemon = None

    def targets(self, store):
        out = []
        for dirpath, _, names in os.walk(store):
            for n in names:
                p = os.path.join(dirpath, n)
                rel = os.path.relpath(p, store)
                if rel in ("lock", "ckptfs.log") or rel.startswith("staging/"):
                    continue
                if rel.startswith("index/") and (n.startswith("LOG") or n == "LOCK"):
                    continue  # RocksDB's own info log and its empty lock file
                if os.path.getsize(p) > 0:
                    out.append(rel)
        return sorted(out)

    def round(self, rng, budget_s):
        if self.files is None:
            self.make_pristine(rng)
        targets = self.targets(self.pristine)
        packs = [t for t in targets if t.startswith("packs/")]
        meta = [t for t in targets if not t.startswith("packs/")]
        for k in range(self.trials):
            where = rng.choice(packs if (rng.random() < 0.6 or not meta) else meta)
            self.trial(rng, where)
        self.stats.add(self.kind, rounds=1)

    def trial(self, rng, where):
        store = os.path.join(self.dir, "store")
        copy_tree(self.pristine, store)
        path = os.path.join(store, where)
        size = os.path.getsize(path)
        off = self.offset(rng, path, size, where.startswith("packs/"))
        with open(path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
        what = f"byte {off} of {where} ({size} bytes)"
        is_pack = where.startswith("packs/")
        self.stats.add(self.kind, operations=1, **{"flips_pack" if is_pack else "flips_meta": 1})
        d = Daemon(self.env, store, self.mnt, logfile=os.path.join(self.dir, "daemon.log"))
        self.daemon = d
        try:
            d.start(timeout=30)
        except Failure as e:
            self.daemon = None
            if is_pack:
                self.stats.fail(self.kind, f"{what}: a store with one damaged pack byte does "
                                f"not mount: {e}")
            else:
                self.stats.add(self.kind, unmountable=1)
                if self.env.verbose:
                    log(f"  damage: {what}: store does not mount (counted)")
            return
        eio, missing, wrong = set(), set(), 0
        for rel, want in sorted(self.files.items()):
            r = self.read_check(os.path.join(self.mnt, rel), want)
            if r == "missing":
                missing.add(rel)
            elif r == "eio":
                eio.add(rel)
            elif r != "ok":
                wrong += 1
                self.stats.fail(self.kind, f"{what}: {rel}: {r}")
        if not d.alive():
            self.stats.fail(self.kind, f"{what}: the daemon died while files were read:\n"
                            f"{d.log_tail()}")
            d.kill9()
            self.daemon = None
            return
        d.stop()
        self.daemon = None
        if missing and is_pack:
            self.stats.fail(self.kind, f"{what}: files no longer listed: {sorted(missing)}")
        self.stats.add(self.kind, files_verified=len(self.files), wrong=wrong,
                       files_eio=len(eio), missing=len(missing))
        rc, out = self.env.ckpt_run("fsck", store)
        if eio:
            if rc == 0:
                self.stats.fail(self.kind, f"{what}: reads failed with EIO for {sorted(eio)} "
                                f"but ckpt fsck passes")
            for rel in eio:
                if "/" + rel not in out and rel not in out:
                    self.stats.fail(self.kind, f"{what}: {rel} gave EIO, ckpt fsck does not "
                                    f"name it:\n{out[-1500:]}")
        if self.env.verbose:
            log(f"  damage: {what}: eio {sorted(eio)} missing {sorted(missing)} fsck rc {rc}")
        shutil.rmtree(store)

    def offset(self, rng, path, size, is_pack):
        """Where to flip: in a pack, 15% in its 64-byte header, 15% in a record's 48-byte
        header, else anywhere; in other files anywhere."""
        x = rng.random()
        if not is_pack or x >= 0.3:
            return rng.randrange(size)
        if x < 0.15:
            return rng.randrange(min(64, size))
        with open(path, "rb") as f:
            data = f.read()
        recs, o = [], data.find(b"CKRC", 64)
        while o >= 0:
            if o % 8 == 0 and o + 48 <= len(data):
                recs.append(o)
            o = data.find(b"CKRC", o + 1)
        if not recs:
            return rng.randrange(size)
        return rng.choice(recs) + rng.randrange(48)

    def read_check(self, path, want):
        """'ok', 'eio' (some reads failed with EIO, none returned wrong bytes), 'missing', or
        a description of what was wrong."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return "missing"
            if e.errno == errno.EIO:
                return "eio"
            return f"open: {e}"
        eio = False
        try:
            size = os.fstat(fd).st_size
            if size != len(want):
                return f"size {size}, want {len(want)}"
            offs = list(range(0, len(want), BLOCK))
            if len(want) > 4096:
                offs.append(len(want) - 4096)
            for off in offs:
                try:
                    b = os.pread(fd, BLOCK, off)
                except OSError as e:
                    if e.errno == errno.EIO:
                        eio = True
                        continue
                    return f"pread at {off}: {e}"
                if b != want[off:off + len(b)] or (not b and off < len(want)):
                    return f"pread at {off}: {len(b)} bytes that differ from the file's"
            try:
                whole = b""
                while True:
                    piece = os.pread(fd, 1 << 20, len(whole))
                    if not piece:
                        break
                    whole += piece
                if whole != want:
                    if want.startswith(whole):
                        return f"whole read ended early at {len(whole)} of {len(want)}"
                    return "a whole read returned bytes that differ from the file's"
            except OSError as e:
                if e.errno != errno.EIO:
                    return f"whole read: {e}"
                eio = True
        finally:
            os.close(fd)
        return "eio" if eio else "ok"

    def finish(self, rng):
        pass

    def abort(self):
        if self.daemon is not None:
            try:
                self.daemon.kill9()
            except Failure:
                pass
            self.daemon = None
