#!/usr/bin/env python3
"""The cache under pressure, random and seeded: ghostfs with a small `--cache-size` (4 MiB)
against a working set several times that (objects from 100 B to 3 MB, one over the cap) on
nginx on loopback, so eviction runs all the time, while
- readers through the mount read web/ files whole, by ranges, by mmap, and keep some open
  across evictions (half read, a pause, the rest);
- ghostproxy, on the same mount and so the same cache, serves GET, Range, HEAD and conditional
  GETs of the same URLs;
- the origin's files are replaced atomically (new size, new date) meanwhile;
- the knob, flushes, drop_caches and ghost hints flip the power manager; rounds alternate a
  plain mount, the ipaq-2004 profile (a sleeping disk) and the profile with a flash log;
- in about half the rounds ghostfs is SIGKILLed under the traffic and mounted again on its cache.

What must hold: every read and every 200/206 is one whole version of the file the origin held
(or that slice of one), never a mix, never short; no EIO (or other error) for a valid operation
outside the moment ghostfs is dead; the index's bytes never pass the cap (`ghostctl stats`,
polled); no hang, no crash; once the readers closed, ghostfs holds no descriptor of a deleted
(evicted) body; after every clean stop the index passes `PRAGMA integrity_check`, every indexed
object has its body file (or a packed body) of its size, no body file is left without a row, and
the body files fit the cap. Then bad input on the same paths (`..`, a name over NAME_MAX,
URL-encoded oddities) through the mount and the proxy: a clear error, both stay up.

First the minimal case of what the random run found (stale_size_case): an open that reads a
new version of another size than the kernel was last told must leave st_size (and so mmap) at
that version's size (main: the old size, and an mmap of it silently the new version's first
bytes).

Known and not fixed (a shortfall line, not a failure): an mmap with MAP_SHARED of a file the
cost model opens from the network (direct_io) fails with ENODEV (the kernel allows it only with
FUSE_DIRECT_IO_ALLOW_MMAP, which would put the inode in cached io mode and turn a later
passthrough open of it into EIO); MAP_PRIVATE works. Now and then an EIO at an open, with nothing
in ghostfs's log, cause not found (the race of a copy evicted between the decision and the open,
which gave EIO too, is fixed and forced in ghostfs_evict_race).

The seed is printed first; replay: ghostfs_evict_random_test.py --seed S [--rounds N --secs S].
Skipped without root, /dev/fuse or nginx."""
import argparse
import errno
import hashlib
import os
import random
import socket
import sqlite3
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402
from ghostproxy_random_test import read_response  # noqa: E402

CAP = 4 << 20
SIZES = [100, 900, 4096, 16384, 16385, 70_000, 300_000, 900_000, 1_800_000, 3_000_000]
NAMES = [f"o{i:02d}.bin" for i in range(16)]
BIG = "big.bin"  # over the cap: never cached, always streamed
OP_TIMEOUT = 30
# With a profile the emulated card (3 Mb/s) carries every transfer, one after another: seven
# workers fetching megabytes at once wait their turn for longer than OP_TIMEOUT, as modelled.
# Those rounds read files of at most SMALL bytes.
SMALL = 300_000
PLAN = 12


def rng_age(v):
    return 5 + v % 11


def version(name, v, size):
    """Version v of `name`: every 64-byte line names the file, the version and the size."""
    line = f"{name} v{v:05d} size {size:08d} ".encode()
    line = line + b"." * (63 - len(line)) + b"\n"
    return (line * (size // 64 + 1))[:size]


class Origin:
    def __init__(self, root, rng):
        self.root, self.lock, self.v = root, threading.Lock(), 0
        self.known = {}  # name -> {sha256: (v, size)}
        self.current = {}
        for name in NAMES + [BIG]:
            self.put(name, 5 << 20 if name == BIG else rng.choice(SIZES))

    def put(self, name, size):
        with self.lock:
            self.v += 1
            v = self.v
            size += v % 97 if name != BIG else 0
            data = version(name, v, size)
            self.known.setdefault(name, {})[hashlib.sha256(data).digest()] = (v, size)
            self.current[name] = (v, size)
        tmp = os.path.join(self.root, "." + name)
        with open(tmp, "wb") as f:
            f.write(data)
        # Modified seconds ago: heuristic freshness (10 % of that) keeps copies about a second,
        # so opens and the proxy revalidate all the time. The size differs from the version
        # before (+ v % 97), so nginx's ETag (mtime and size) does too.
        t = time.time() - rng_age(v)
        os.utime(tmp, (t, t))
        os.rename(tmp, os.path.join(self.root, name))

    def is_version(self, name, data):
        with self.lock:
            return hashlib.sha256(data).digest() in self.known[name]

    def slice_sizes(self, name, data, off):
        """The sizes of the versions of which `data` is the bytes at `off`."""
        with self.lock:
            cands = list(self.known[name].values())
        return {sz for v, sz in cands if version(name, v, sz)[off:off + len(data)] == data}

    def pick(self, rng, names, small_only):
        """One of `names`; with `small_only`, one now at most SMALL bytes (another name if the
        first pick is bigger: a few tries)."""
        for _ in range(8):
            name = rng.choice(names)
            if not small_only or self.current[name][1] <= SMALL:
                return name
        return min(names, key=lambda n: self.current[n][1])

    def sizes(self, name):
        with self.lock:
            return {sz for _, sz in self.known[name].values()}


class Run:
    """What the workers share: the errors, the counts, and when ghostfs is down (a kill)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.errors, self.counts, self.stale, self.enodev, self.open_eio = [], {}, [], [], []
        self.down = threading.Event()  # set from just before a SIGKILL until the remount
        self.down_until = 0.0
        self.kills = []  # when ghostfs was killed in this round
        self.after_kill = []  # proxy requests unanswered for OP_TIMEOUT in a round with a kill

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def excused(self):
        """An error now or just after a kill is the kill's, not a bug."""
        return self.down.is_set() or time.time() < self.down_until

    def error(self, what):
        if self.excused():
            self.count("excused")
            return
        with self.lock:
            self.errors.append(what)

    def stale_size(self, what):
        """st_size after an open said another version's size than the open reads. The inode has
        one size: a concurrent open of a newer version (or a fill replacing the copy) may change
        it after this open. The case without such a race is checked in stale_size_case."""
        self.count("stale-size")
        with self.lock:
            self.stale.append(what)


MMAP_CHILD = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
flags = mmap.MAP_SHARED if sys.argv[2] == "mmap-shared" else mmap.MAP_PRIVATE
try:
    m = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ) if size else b""
except OSError as e:
    sys.exit(e.errno)
except ValueError:  # Python's own fstat in mmap() saw a smaller st_size than ours just did
    sys.exit(100)
sys.stdout.buffer.write(bytes(m))
sys.stderr.write(str(size))
"""


def mount_reader(w, seed, mnt, origin, run, stop, small_only):
    rng = random.Random(f"{seed}:reader:{w}")
    while not stop.is_set():
        name = origin.pick(rng, NAMES[:6] if w % 2 else NAMES + [BIG], small_only)
        path = os.path.join(mnt, "web", name)
        how = rng.choice(["whole", "whole", "range", "mmap", "mmap-shared", "kept"])
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            if e.errno == errno.EIO and not run.excused():  # the shortfall in main
                with run.lock:
                    run.open_eio.append(f"reader {w} open {name} ({how})")
            else:
                run.error(f"reader {w} open {name}: {e}")
            run.count("open-" + errno.errorcode.get(e.errno, "?"))
            if run.excused():
                time.sleep(0.2)
            continue
        got = 0
        try:
            size = os.fstat(fd).st_size
            if how == "range":
                off = rng.randrange(0, max(1, size))
                b = os.pread(fd, rng.choice([1, 4096, 100_000]), off)
                sizes = origin.slice_sizes(name, b, off) if b else {size}
                if not sizes:
                    run.error(f"reader {w} {name}: {len(b)} bytes at {off} (size {size}) are no slice of a version; "
                              f"lines of {sorted({ln[:22] for ln in b.split(bytes([10]))[1:-1]})[:3]}")
                elif size not in sizes:
                    run.stale_size(f"reader {w} range {name}: st_size {size}, the bytes are of a version of {sizes}")
            elif how.startswith("mmap") and size:
                # In a child: a page past the file's end is SIGBUS, which would end this test.
                r = subprocess.run([sys.executable, "-c", MMAP_CHILD, path, how], capture_output=True,
                                   timeout=OP_TIMEOUT)
                if r.returncode == -7:
                    run.stale_size(f"reader {w} {how} {name}: SIGBUS in an mmap of st_size")
                    continue
                if r.returncode == 100:
                    # The same race seen earlier: st_size shrank between the child's fstat and
                    # the one inside Python's mmap() (stop 30's CI, seed 1491: a ValueError,
                    # "mmap length is greater than file size", which this test took for an error).
                    run.stale_size(f"reader {w} {how} {name}: st_size shrank between fstat and mmap")
                    continue
                if r.returncode == 19:
                    raise OSError(errno.ENODEV, "mmap: No such device")
                if r.returncode != 0:
                    raise OSError(r.returncode, r.stderr.decode(errors="replace")[-200:])
                data, size = r.stdout, int(r.stderr)
                if not origin.is_version(name, data):
                    whole_short = [sz for sz in origin.sizes(name) if sz < len(data) and not data[sz:].strip(b"\0")
                                   and origin.is_version(name, data[:sz])]
                    if origin.slice_sizes(name, data, 0) or whole_short:
                        # A version's start, or a whole version and zeros: st_size was another's.
                        run.stale_size(f"reader {w} {how} {name}: st_size {size}, a version of "
                                       f"{origin.slice_sizes(name, data, 0) or whole_short} bytes")
                    else:
                        run.error(f"reader {w} {how} {name}: {size} bytes are no whole version nor a version's "
                                  f"start; starts {data[:30]!r}")
            else:
                data, chunk = bytearray(), rng.choice([4096, 65536, 1 << 20])
                pause_at = size // 2 if how == "kept" else -1
                while True:
                    b = os.pread(fd, chunk, len(data))
                    if not b:
                        break
                    data += b
                    got = len(data)
                    if pause_at >= 0 and len(data) >= pause_at:
                        pause_at = -1
                        stop.wait(rng.uniform(0.3, 1.5))  # others evict meanwhile
                if not origin.is_version(name, bytes(data)):
                    lines = sorted({ln[:22] for ln in bytes(data).split(b"\n") if ln})[:3]
                    run.error(f"reader {w} {name} ({how}): {len(data)} bytes (stat said {size}) are no whole "
                              f"version; lines of {lines}")
            run.count("mount-" + how)
        except OSError as e:
            if e.errno == errno.ENODEV and how == "mmap-shared":
                run.count("mmap-shared-ENODEV")
                with run.lock:
                    run.enodev.append(name)
            elif e.errno == errno.ESTALE and name == BIG:
                # Documented (DESIGN §4.1) for a body past the stream's window whose origin
                # changed: only the file over the cap is streamed and large enough for that.
                run.count("estale-big")
            elif e.errno == errno.EIO and got == 0 and not run.excused():
                # The first read of a handle opened on a copy that went away before it: as the
                # open's EIO, the shortfall in main.
                with run.lock:
                    run.open_eio.append(f"reader {w} {how} {name}: EIO at the first read")
                run.count("read-EIO-first")
            else:
                run.error(f"reader {w} {how} {name}: {e} ({got} bytes read)")
                run.count("read-" + errno.errorcode.get(e.errno, "?"))
        finally:
            os.close(fd)


class ProxyClient:
    def __init__(self, cid, seed, port, base, origin, run, stop, small_only):
        self.cid, self.rng, self.port, self.base = cid, random.Random(f"{seed}:client:{cid}"), port, base
        self.origin, self.run, self.stop, self.etags, self.small_only = origin, run, stop, {}, small_only

    def ask(self, name, method="GET", extra=""):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=OP_TIMEOUT)
        with s:
            s.sendall(f"{method} {self.base}{name} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Connection: close\r\n\r\n"
                      .encode())
            return read_response(s.makefile("rb"), head_only=method == "HEAD")

    def whole(self, what, name, r):
        if r is None:
            self.run.error(f"proxy {what} {name}: no answer")
        elif r.status != 200:
            self.run.error(f"proxy {what} {name}: status {r.status}")
        elif not self.origin.is_version(name, r.body):
            self.run.error(f"proxy {what} {name}: {len(r.body)} bytes are no whole version; starts {r.body[:30]!r}")
        elif r.headers.get("etag"):
            self.etags[name] = r.headers["etag"]

    def loop(self):
        while not self.stop.is_set():
            name = self.origin.pick(self.rng, NAMES + [BIG], self.small_only)
            op = self.rng.choice(["get", "get", "range", "head", "cond"])
            t_op = time.time()
            try:
                if op == "range":
                    size = self.origin.current[name][1]
                    lo = self.rng.randrange(size)
                    hi = min(size - 1, lo + self.rng.randint(0, 200_000))
                    r = self.ask(name, extra=f"Range: bytes={lo}-{hi}\r\n")
                    if r is not None and r.status == 206:
                        cr = r.headers.get("content-range", "")
                        a, b = (int(x) for x in cr.split()[1].split("/")[0].split("-"))
                        total = int(cr.split("/")[1])
                        if len(r.body) != b - a + 1 or total not in self.origin.slice_sizes(name, r.body, a):
                            self.run.error(f"proxy range {name}: 206 {cr} with {len(r.body)} bytes, no slice of a version")
                    elif r is None or r.status != 416:  # 416: the file shrank meanwhile
                        self.whole("range answered whole", name, r)
                elif op == "head":
                    r = self.ask(name, method="HEAD")
                    if r is None or r.status != 200 or int(r.headers.get("content-length", -1)) not in self.origin.sizes(name):
                        self.run.error(f"proxy HEAD {name}: {r and r.status} length {r and r.headers.get('content-length')}")
                elif op == "cond" and name in self.etags:
                    r = self.ask(name, extra=f"If-None-Match: {self.etags[name]}\r\n")
                    if r is None or r.status != 304:
                        self.whole("conditional", name, r)
                else:
                    self.whole("GET", name, self.ask(name))
                self.run.count("proxy-" + op)
            except TimeoutError as e:
                what = f"proxy {op} {name}: {e} after {time.time() - t_op:.1f} s"
                if self.run.kills:  # a round with a SIGKILL of ghostfs: see run.after_kill
                    with self.run.lock:
                        self.run.after_kill.append(f"{what}, {t_op - self.run.kills[-1]:.1f} s after the kill")
                else:
                    self.run.error(what)
            except (OSError, ValueError, IndexError) as e:
                self.run.error(f"proxy {op} {name}: {type(e).__name__} {e} after {time.time() - t_op:.1f} s")


def changer(seed, origin, stop):
    rng = random.Random(f"{seed}:changer")
    while not stop.wait(rng.uniform(0.05, 0.4)):
        origin.put(rng.choice(NAMES), rng.choice(SIZES))


def power(seed, ctl_path, run, stop, profile):
    rng = random.Random(f"{seed}:power")
    try:
        c = h.Control(ctl_path)
    except OSError as e:
        run.error(f"power: control socket: {e}")
        return
    while not stop.wait(rng.uniform(0.1, 0.6)):
        what = rng.choice(["knob", "flush", "hints", "drop_caches"] if profile else ["knob", "flush", "drop_caches"])
        try:
            if what == "knob":
                c.ok("knob", value=rng.choice([0, 0, 10, 50, 100]))
            elif what == "hints":
                c.ghost_hints(n=rng.choice([1, 20]))
            else:
                c.ok(what)
            run.count("power-" + what)
        except (OSError, ValueError) as e:  # the daemon was killed under us
            run.error(f"power {what}: {e}")
            return
        except RuntimeError as e:
            run.error(f"power {what}: {e}")
    c.close()


def cache_state(cache):
    """What an index at rest must satisfy: [] or the problems. Every complete row has its body
    (packed in the row, or a file of its size), no body file lacks a row, bytes within the cap."""
    probs = h.index_problems(cache)
    store = os.path.join(cache, "objects-db")
    db = sqlite3.connect(os.path.join(store, "index.sqlite"))
    try:
        rows = db.execute("SELECT key, size, body IS NOT NULL, complete FROM objects").fetchall()
    finally:
        db.close()
    files = {}
    for dirpath, _, names in os.walk(os.path.join(store, "objects")):
        for n in names:
            files[n] = os.path.getsize(os.path.join(dirpath, n))
    on_disk = sum(files.values())
    total = 0
    for key, size, packed, complete in rows:
        name = hashlib.sha256(key.encode()).hexdigest()
        total += size
        if not complete:
            probs.append(f"{key}: a row with complete=0 after a clean stop")
        elif not packed and files.get(name) != size:
            probs.append(f"{key}: {size} bytes indexed, body file {files.get(name)}")
        files.pop(name, None)
    if files:
        probs.append(f"{len(files)} body files without a row: {sorted(files)[:5]}")
    if total > CAP or on_disk > CAP:
        probs.append(f"indexed {total} bytes, {on_disk} in body files: over the cap {CAP}")
    return probs


def deleted_fds(pid, cache):
    """ghostfs's descriptors of deleted files under the cache directory (evicted bodies)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(cache) and target.endswith(" (deleted)"):
            out.append(target)
    return out


def bad_input(mnt, port, base):
    """`..`, a name over NAME_MAX, URL-encoded oddities through the mount and the proxy."""
    bad = []
    for rel, ok_errnos in [("web/../web/o00.bin", None), ("web/" + "n" * 300, {errno.ENAMETOOLONG, errno.ENOENT}),
                           ("web/%2e%2e%2fetc%2fpasswd", {errno.ENOENT}), ("web/o00.bin%00", {errno.ENOENT}),
                           ("web/%", {errno.ENOENT}), ("web/" + "a/" * 40 + "x", {errno.ENOENT}),
                           ("web/o00.bin/..", {errno.ENOTDIR})]:
        try:
            with open(os.path.join(mnt, rel), "rb") as f:
                f.read(1)
            if ok_errnos is not None:
                bad.append(f"mount {rel[:40]}: opened")
        except OSError as e:
            if ok_errnos is None or e.errno not in ok_errnos:
                bad.append(f"mount {rel[:40]}: {e}")
    for target in [base + "../../etc/passwd", base + "%2e%2e/%2e%2e/etc/passwd", base + "o00.bin%00x",
                   base + "%ZZ", base + "n" * 5000, base + "a/" * 200 + "x", base + "o00.bin?%00"]:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=OP_TIMEOUT)
            with s:
                s.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
                r = read_response(s.makefile("rb"))
            if r is None or r.status >= 500 or b"root:" in r.body:
                bad.append(f"proxy {target[-40:]}: {r and r.status}")
        except OSError as e:
            bad.append(f"proxy {target[-40:]}: {e}")
    return bad


def stale_size_case(t, work, site, base):
    """The minimal case: the kernel holds a file's size from a stat; the origin replaces the file
    with one of another size; an open at once (the copy is stale: revalidated, 200) reads the
    new version, so fstat and an mmap of st_size must give the new version whole (main: the old
    size, and the mmap the new version's first bytes, short as if complete)."""
    conf = os.path.join(work, "stale.toml")
    with open(conf, "w") as f:
        f.write("heuristic_freshness = 1\n")
    mnt, cache = os.path.join(work, "mnt-stale"), os.path.join(work, "cache-stale")
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, cache, {"web": base}, args=["--config", conf, "--cache-size", str(CAP)])
    if not fs.start():
        return t.check(False, "stale size: mounts", fs.output()[-1500:])
    path, name, got = os.path.join(mnt, "web", "s.bin"), "s.bin", []

    def put(v, size):
        with open(os.path.join(site, ".s"), "wb") as f:
            f.write(version(name, v, size))
        # Last modified 8 s ago: heuristic freshness (10 % of that) keeps a copy 0.8 s.
        os.utime(os.path.join(site, ".s"), (time.time() - 8, time.time() - 8))
        os.rename(os.path.join(site, ".s"), os.path.join(site, name))
    try:
        for i, (old, new) in enumerate([(300_000, 3_000_000), (900_000, 70_000)]):
            put(2 * i, old)
            time.sleep(1.2)  # the copy (fresh for 1 s) is stale: the read revalidates and caches `old`
            h.read_bytes(path)
            time.sleep(1.2)  # stale again, and so are the kernel's attributes (1 s)
            os.stat(path)  # the kernel holds the cached copy's size for a second
            put(2 * i + 1, new)
            # The open revalidates (200, the new version); fstat, mmap of st_size (in a child:
            # SIGBUS past the end).
            r = subprocess.run([sys.executable, "-c", MMAP_CHILD, path, "mmap"], capture_output=True, timeout=60)
            st = int(r.stderr) if r.returncode == 0 else f"exit {r.returncode} (-7: SIGBUS)"
            got.append((old, new, st, len(r.stdout), r.stdout == version(name, 2 * i + 1, new)))
    finally:
        fs.stop()
    t.check(all(st == new and ok for old, new, st, _, ok in got),
            "an open that reads a new version of another size: st_size and an mmap of it are that version's",
            "\n".join(f"{old} -> {new} bytes: st_size {st}, mmap {n} bytes, whole new version {ok}"
                      for old, new, st, n, ok in got))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=int(os.environ.get("GHOST_SEED", time.time_ns() % 100000)))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--secs", type=float, default=12.0)
    opts = ap.parse_args()
    opts.rounds = max(1, opts.rounds)
    print(f"# seed {opts.seed} (replay: --seed {opts.seed} --rounds {opts.rounds} --secs {opts.secs})", flush=True)
    h.require_root_and_fuse()
    rng = random.Random(opts.seed)
    work = h.tempdir()
    site, mnt, cache, ctl = (os.path.join(work, x) for x in ("site", "mnt", "cache", "ctl.sock"))
    os.makedirs(site)
    os.makedirs(mnt)
    origin = Origin(site, rng)
    nginx = h.Nginx(site)
    if not nginx.start():
        h.skip_all("nginx is not installed or did not start")
    t = h.Tap(PLAN)
    base = nginx.url()
    stale_size_case(t, work, site, base)
    conf = os.path.join(work, "ghostfs.toml")
    with open(conf, "w") as f:
        f.write("heuristic_freshness = 1\n")
    port = h.free_port()
    proxy = None
    run = Run()
    stopped_state, fd_leaks, cap_seen, mounted, alive = [], [], [], True, True
    kinds = {"plain": [], "profile": ["--profile", "ipaq-2004"],
             "flash": ["--profile", "ipaq-2004", "--flash-log", os.path.join(work, "flash") + ":512K"]}
    fs, daemons = None, []
    t0 = time.time()
    for rnd in range(opts.rounds):
        kind = ["plain", "profile", "flash"][rnd % 3] if rnd < 3 else rng.choice(list(kinds))
        kill = rng.random() < 0.5 if rnd else False
        args = ["--config", conf, "--cache-size", str(CAP)] + kinds[kind]
        fs = h.Ghostfs(mnt, cache, {"web": base}, args=args, control=ctl)
        daemons.append(fs)
        if not fs.start():
            mounted = False
            break
        if proxy is None:
            exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
            proxy = subprocess.Popen([exe, "--listen", f"127.0.0.1:{port}", "--mount", mnt, "--control", ctl],
                                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "proxy.err"), "w"))
            h.on_exit(lambda: proxy.poll() is None and proxy.terminate())
            if not h.wait_port(port, 15):
                mounted = False
                break
        print(f"# round {rnd}: {kind}{', SIGKILL mid-round' if kill else ''} (at {time.time() - t0:.0f} s)", flush=True)
        rseed = f"{opts.seed}:{rnd}"
        stop = threading.Event()
        run.kills = []
        small = kind != "plain"
        threads = [threading.Thread(target=mount_reader, args=(w, rseed, mnt, origin, run, stop, small))
                   for w in range(4)]
        threads += [threading.Thread(target=ProxyClient(c, rseed, port, base, origin, run, stop, small).loop)
                    for c in range(3)]
        threads += [threading.Thread(target=changer, args=(rseed, origin, stop)),
                    threading.Thread(target=power, args=(rseed, ctl, run, stop, kind != "plain"))]
        for th in threads:
            th.daemon = True
            th.start()
        end, killed = time.time() + opts.secs, False
        c = h.Control(ctl)
        while time.time() < end:
            try:
                st = c.ok("stats")["cache"]
                cap_seen.append(st["bytes"])
            except (OSError, ValueError, RuntimeError) as e:
                run.error(f"stats: {e}")
            if kill and not killed and time.time() > end - opts.secs / 2:
                run.down.set()
                run.kills.append(time.time())
                fs.kill9()
                killed = True
                time.sleep(0.3)
                fs = h.Ghostfs(mnt, cache, {"web": base}, args=args, control=ctl)
                daemons.append(fs)
                up = fs.start()
                run.down_until = time.time() + 1.0
                run.down.clear()
                if not up:
                    mounted = False
                    break
                c = h.Control(ctl)
                threading.Thread(target=power, args=(rseed + ":after", ctl, run, stop, kind != "plain"),
                                 daemon=True).start()
            time.sleep(0.3)
        stop.set()
        t_join = time.time()
        for th in threads:
            th.join(OP_TIMEOUT + 10)
        print(f"# round {rnd}: workers done in {time.time() - t_join:.1f} s", flush=True)
        if any(th.is_alive() for th in threads):
            run.errors.append(f"round {rnd}: a worker hung")
        c.close()
        if not mounted:
            break
        alive = alive and fs.proc.poll() is None and proxy.poll() is None
        c = h.Control(ctl)
        c.ok("flush")
        c.close()
        time.sleep(0.5)
        fd_leaks += [f"round {rnd}: {x}" for x in deleted_fds(fs.proc.pid, cache)]
        print(f"# round {rnd}: ghostfs holds {len(os.listdir(f'/proc/{fs.proc.pid}/fd'))} fds, "
              f"ghostproxy {len(os.listdir(f'/proc/{proxy.pid}/fd'))}", flush=True)
        t_stop = time.time()
        fs.stop()
        stopped_state += [f"round {rnd}: {p}" for p in cache_state(cache)]
        print(f"# round {rnd}: stopped and checked in {time.time() - t_stop:.1f} s", flush=True)
    print(f"# {opts.rounds} rounds in {time.time() - t0:.0f} s; ops {dict(sorted(run.counts.items()))}; "
          f"versions written {origin.v}; cache bytes seen max {max(cap_seen, default=0)} of {CAP}", flush=True)
    if not t.check(mounted, "ghostfs mounts (and remounts after each kill) and ghostproxy starts", fs.output()[-1500:]):
        t.skip_rest(PLAN - 2, "no mount")
        t.done()
    t.check(not run.errors, f"every read and answer is one whole version (or a slice of one), no error for a valid "
            f"operation, no hang (seed {opts.seed})", "\n".join(run.errors[:15] + [
                ln for d in daemons for ln in d.output().splitlines() if "info:" not in ln and "not caching" not in ln][-15:]))
    t.check(alive, "ghostfs and ghostproxy stayed up through every round", fs.output()[-1500:])
    t.check(cap_seen and max(cap_seen) <= CAP, "the index's bytes never passed the cap", max(cap_seen, default=None))
    t.check(not fd_leaks, "once the readers closed, ghostfs holds no descriptor of an evicted body", "\n".join(fd_leaks[:10]))
    t.check(not stopped_state, "after every clean stop: integrity_check ok, every row has its body, no orphan "
            "body file, the bodies fit the cap", "\n".join(stopped_state[:10]))
    t.shortfall(not run.after_kill, "no ghostproxy request hangs in a round where ghostfs was SIGKILLed and remounted",
                "found here, not yet explained: a request after the remount now and then gets no answer for "
                f"{OP_TIMEOUT} s (other requests are answered meanwhile)", "\n".join(run.after_kill[:10]))
    # A copy evicted between the open's decision and the open is fetched again now (the race
    # ghostfs_evict_race forces, a check there). An EIO at an open is still seen here now and then,
    # with nothing in ghostfs's log: a shortfall until its cause is found. The daemon's lines
    # about the names are shown with it.
    eio_names = {e.split()[3].rstrip(":") for e in run.open_eio}
    t.shortfall(not run.open_eio, "no EIO at the open of a web/ file, or at its first read, under eviction pressure",
                "the evicted-copy race is fixed (ghostfs_evict_race); an EIO at the open with nothing in ghostfs's "
                "log remains, cause not found (evict15, 20 random seeds each: main's binary 4 runs with EIO, 3 opens "
                "and 2 first reads of big.bin; with the fix 1 run, one open of o04.bin; bugs16: 0 in 60 runs, and "
                "every EIO the origin tree answers now logs its path and cause: one with no line is likely the kernel's)",
                "\n".join(run.open_eio[:10] + [ln for d in daemons for ln in d.output().splitlines()
                                                if any(n in ln for n in eio_names)][-10:]))
    t.shortfall(not run.enodev, "mmap MAP_SHARED of a web/ file opened from the network works",
                "the kernel refuses MAP_SHARED of a direct_io open without FUSE_DIRECT_IO_ALLOW_MMAP, which "
                "conflicts with passthrough opens of the inode; MAP_PRIVATE works",
                f"{len(run.enodev)} ENODEV, e.g. {run.enodev[:3]}")
    if run.stale:
        print(f"# st_size of another version after an open (races with a newer open): {len(run.stale)}, "
              f"e.g. {run.stale[:2]}", flush=True)
    fs = h.Ghostfs(mnt, cache, {"web": base}, args=["--config", conf, "--cache-size", str(CAP)], control=ctl)
    fs.start()
    bad = bad_input(mnt, port, base)
    t.check(not bad, "bad names through the mount and the proxy get a clear error", "\n".join(bad))
    data = h.read_bytes(os.path.join(mnt, "web", "o00.bin"))
    t.check(origin.is_version("o00.bin", data) and fs.proc.poll() is None and proxy.poll() is None,
            "... and the mount and the proxy still serve whole versions", fs.output()[-800:])
    proxy.terminate()
    proxy.wait(10)
    fs.stop()
    t.done()


if __name__ == "__main__":
    # meson stops the test at 240 s: before that, a hang reports where it waits
    with h.Watchdog(210, h.tracked_alive):
        main()
