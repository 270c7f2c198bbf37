#!/usr/bin/env python3
"""Many things at once in local/: several processes run seeded random-operation sequences
(ghostfs_random_ops_test's operations plus fallocate, fdatasync, copy_file_range and sendfile),
each in its own subtree and replayed step by step on a plain directory, while they all append
records to one shared file and write disjoint blocks of another, and a thread changes the power
state under them (knob, flush, drop_caches, ghost hints that wake the card). Every result (value
or errno) must match the plain directory's, and so must the final trees; every appended record
must be there whole, exactly once; every block must hold its writer's bytes.

Then crash cycles: the same load runs beside writers that fsync / fdatasync / msync(MS_SYNC)
their own files, ghostfs is SIGKILLed at a random moment and mounted again on the same cache
directory. After each restart every byte whose sync returned is there, and every other byte of
those files is one that was written since (or a zero of a truncate/extension): no garbage; the
index passes `PRAGMA integrity_check`.

Runs on three mounts: plain; --profile ipaq-2004 --knob 0; the same with a small --flash-log.
The seed is printed first; replay: ghostfs_concurrent_test.py --seed S [--procs N --ops N
--cycles N --modes plain,profile,flash]. TAP; skipped without root or /dev/fuse."""
import ctypes
import errno
import hashlib
import mmap
import multiprocessing as mp
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402
import ghostfs_random_ops_test as ro  # noqa: E402

MODES = {"plain": [], "profile": ["--profile", "ipaq-2004", "--knob", "0"],
         "flash": ["--profile", "ipaq-2004", "--knob", "0", "--flash-log", "{work}/flash-{label}:512K"]}
RECORD = 300          # bytes of one appended record
BLOCK = 4096          # bytes of one block of the shared grid
CRASH_FILES = 3
CRASH_MAX = 200_000
# pwrite, append, truncate, fsync, fdatasync, msync, fallocate
CRASH_WEIGHTS = [int(x) for x in os.environ.get("GHOST_CRASH_WEIGHTS", "30,10,4,6,6,4,3").split(",")]


# ---------------------------------------------------------------- the differential workers

def extra_op(rng, open_slots):
    slot = rng.choice(open_slots) if open_slots and rng.random() < 0.9 else rng.randrange(ro.SLOTS)
    kind = rng.choice(["fallocate", "fdatasync", "copy_file_range", "sendfile"])
    if kind == "fallocate":
        return kind, (slot, rng.randrange(ro.MAX_SIZE), rng.choice([1, 4096, 70000]))
    if kind == "fdatasync":
        return kind, (slot,)
    other = rng.choice(open_slots) if open_slots else rng.randrange(ro.SLOTS)
    return kind, (slot, other, rng.randrange(ro.MAX_SIZE), rng.randrange(ro.MAX_SIZE), rng.choice([1, 5000, 70000]))


def apply_extra(side, name, args):
    try:
        fd = ro.fd_of(side, args[0])
        if name == "fallocate":
            return "ok", os.posix_fallocate(fd, args[1], args[2])
        if name == "fdatasync":
            return "ok", os.fdatasync(fd)
        src = ro.fd_of(side, args[1])
        if name == "copy_file_range":
            return "ok", os.copy_file_range(src, fd, args[4], args[2], args[3])
        if name == "sendfile":
            return "ok", os.sendfile(fd, src, args[2], args[4])
    except OSError as e:
        return "err", errno.errorcode.get(e.errno, str(e.errno))
    raise AssertionError(name)


def shared_record(w, seq):
    head = f"<{w}:{seq}:".encode()
    body = hashlib.sha256(head).hexdigest().encode()
    return head + (body * 10)[:RECORD - len(head) - 2] + b">\n"


def grid_block(w, k):
    return hashlib.sha256(f"grid {w} {k}".encode()).digest() * (BLOCK // 32)


def saved_bytes(name):
    n = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 150_000 + 1
    return (hashlib.sha256(name.encode()).digest() * (n // 32 + 1))[:n]


def save_and_peek(rng, w, i, shared):
    """The atomic-save pattern across processes: a file written whole under a temporary name
    (an open-time O_TRUNC rewrite, sometimes fsync'd) and renamed over a name others read;
    every file another process opens under a saved name must hold whole bytes of one save.
    Returns what is wrong, or None."""
    name = f"save-{w}-{rng.randrange(3)}"
    tmp = os.path.join(shared, f".tmp-{w}")
    stamp = f"{name}@{i}"
    data = stamp.encode() + b"\0" + saved_bytes(stamp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, len(data), 16384):
            os.write(fd, data[off:off + 16384])
        if rng.random() < 0.3:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(shared, name))
    peers = [n for n in os.listdir(shared) if n.startswith("save-")]
    if not peers:
        return f"listdir of the shared directory shows no saved file after the rename of {name}"
    peer = rng.choice(peers)
    try:
        with open(os.path.join(shared, peer), "rb") as f:
            got = f.read()
    except FileNotFoundError:  # a rename over a name leaves it there throughout
        return f"{peer}, listed, is gone at the open"
    head, _, body = got.partition(b"\0")
    if not head.startswith(peer.encode() + b"@") or body != saved_bytes(head.decode(errors="replace")):
        return f"{peer} holds {len(got)} bytes that are no whole save (starts {got[:30]!r})"
    return None


def worker(w, seed, ops, mbox, pbox, shared, nprocs, out, stop_on_error):
    """One process: its random sequence on mbox (mount) and pbox (plain) side by side, with an
    append to the shared log and a block of the grid every few steps."""
    rng = random.Random(seed * 1000 + w)
    a, b = ro.Side(os.path.join(mbox, "top")), ro.Side(os.path.join(pbox, "top"))
    mismatch, appended, blocks, done = None, [], [], 0
    logfd = gridfd = -1
    try:
        for d in ro.DIRS[1:]:
            for s in (a, b):
                os.makedirs(s.p(d), exist_ok=True)
        logfd = os.open(os.path.join(shared, "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        gridfd = os.open(os.path.join(shared, "grid"), os.O_RDWR | os.O_CREAT, 0o644)
        for i in range(ops):
            if rng.random() < 0.15:
                name, args = extra_op(rng, sorted(a.fds))
                ra, rb = apply_extra(a, name, args), apply_extra(b, name, args)
            else:
                name, args = ro.make_op(rng, sorted(a.fds))
                ra, rb = ro.apply(a, name, args), ro.apply(b, name, args)
            done = i + 1
            if ra != rb or sorted(a.fds) != sorted(b.fds):
                mismatch = f"w{w} op {i} {name}{ro.short(args)}: local/ {ro.short(ra)}, plain {ro.short(rb)}"
                if isinstance(ra[1], bytes) and isinstance(rb[1], bytes):
                    first = next((j for j, (x, y) in enumerate(zip(ra[1], rb[1])) if x != y), None)
                    mismatch += f" ({len(ra[1])} vs {len(rb[1])} bytes, first difference at {first})"
                break
            if i % 5 == 0:
                rec = shared_record(w, len(appended))
                try:
                    n = os.write(logfd, rec)
                except OSError as e:
                    if stop_on_error:
                        break
                    mismatch = f"w{w} append: {e}"
                    break
                if n != len(rec):
                    mismatch = f"w{w} append wrote {n} of {len(rec)}"
                    break
                appended.append(len(appended))
            if i % 7 == 0:
                k = len(blocks)
                try:
                    os.pwrite(gridfd, grid_block(w, k), (k * nprocs + w) * BLOCK)
                except OSError as e:
                    if stop_on_error:
                        break
                    mismatch = f"w{w} grid: {e}"
                    break
                blocks.append(k)
                if k % 8 == 3:
                    (os.fsync if k % 16 == 3 else os.fdatasync)(gridfd)
            if i % 11 == 0 and not stop_on_error:
                why = save_and_peek(rng, w, i, shared)
                if why:
                    mismatch = f"w{w} op {i}: {why}"
                    break
    except Exception as e:  # noqa: BLE001 - reported, not raised, from a child
        mismatch = f"w{w} op {done}: {type(e).__name__}: {e}"
    finally:
        for s in (a, b):
            try:
                s.close_all()
            except OSError:
                pass
        for fd in (logfd, gridfd):
            try:
                os.close(fd)
            except OSError:
                pass
    out.put((w, mismatch, len(appended), len(blocks), done))


def check_shared(shared, counts, nprocs):
    """Problems of the shared log and grid, given how many records/blocks each worker wrote."""
    problems = []
    with open(os.path.join(shared, "log"), "rb") as f:
        data = f.read()
    want = {}
    for w, n in counts.items():
        for s in range(n[0]):
            want[shared_record(w, s)] = 0
    pos = 0
    while pos < len(data):
        rec = data[pos:pos + RECORD]
        if rec not in want:
            problems.append(f"log: bytes at {pos} are no record: {rec[:40]!r}")
            break
        want[rec] += 1
        pos += RECORD
    bad = [r[:12] for r, c in want.items() if c != 1]
    if bad:
        problems.append(f"log: {len(bad)} records not there exactly once, e.g. {bad[:3]}")
    with open(os.path.join(shared, "grid"), "rb") as f:
        grid = f.read()
    for w, n in counts.items():
        for k in range(n[1]):
            off = (k * nprocs + w) * BLOCK
            if grid[off:off + BLOCK] != grid_block(w, k):
                problems.append(f"grid: block {k} of w{w} at {off} is not its bytes")
                break
    return problems


# ---------------------------------------------------------------- power flips

class Flipper(threading.Thread):
    """Changes the knob, flushes, drops caches and wakes the card at random moments."""

    def __init__(self, ctl, seed):
        super().__init__(daemon=True)
        self.ctl, self.rng, self.stop, self.done, self.errors = ctl, random.Random(seed), threading.Event(), [], []

    def run(self):
        try:
            c = h.Control(self.ctl)
        except OSError as e:
            self.errors.append(f"connect: {e}")
            return
        while not self.stop.wait(self.rng.uniform(0.02, 0.4)):
            what = self.rng.choice(["knob", "knob", "knob", "flush", "drop_caches", "hints", "stats"])
            try:
                if what == "knob":
                    c.ok("knob", knob=self.rng.choice([0, 0, 0, 0, 1, 10, 50, 100]))
                elif what == "hints":
                    c.ghost_hints(n=self.rng.choice([1, 20]))
                else:
                    c.ok(what)
                self.done.append(what)
            except (OSError, ValueError) as e:  # the daemon was killed under us
                self.errors.append(f"{what}: {e}")
                return
            except RuntimeError as e:
                self.errors.append(f"{what}: {e}")


# ---------------------------------------------------------------- crash writers

class Model:
    """What a file must hold after a crash: the bytes at its last sync, and what came since."""

    def __init__(self, synced=b""):
        self.synced = bytearray(synced)
        self.cur = bytearray(synced)
        self.since = []        # (offset, bytes) written since the last sync
        self.sizes = {len(synced)}
        self.zeroed = []       # (start, end) ranges a truncate or extension made zero since the sync

    def write(self, off, data):
        if off > len(self.cur):
            self.zeroed.append((len(self.cur), off))
            self.cur.extend(bytes(off - len(self.cur)))
        self.cur[off:off + len(data)] = data
        self.since.append((off, bytes(data)))
        self.sizes.add(len(self.cur))

    def truncate(self, n):
        if n < len(self.cur):
            self.zeroed.append((n, len(self.cur)))
            del self.cur[n:]
        else:
            self.zeroed.append((len(self.cur), n))
            self.cur.extend(bytes(n - len(self.cur)))
        self.sizes.add(n)

    def sync(self):
        self.synced = bytearray(self.cur)
        self.since, self.zeroed, self.sizes = [], [], {len(self.cur)}

    def check(self, got):
        """None, or what is wrong with `got` as the file after a crash."""
        if len(got) not in self.sizes and not (min(self.sizes) <= len(got) <= max(self.sizes)):
            return f"size {len(got)}, possible {sorted(self.sizes)}"
        allowed_zero = bytearray(len(got))
        for s, e in self.zeroed:
            allowed_zero[s:min(e, len(got))] = b"\1" * max(0, min(e, len(got)) - s)
        touched = {}
        for off, data in self.since:
            for i in range(off, min(off + len(data), len(got))):
                touched.setdefault(i, set()).add(data[i - off])
        for i, byte in enumerate(got):
            if i < len(self.synced) and byte == self.synced[i]:
                continue
            # Past the synced size a write that did not land leaves a hole (zeros).
            if byte in touched.get(i, ()) or (byte == 0 and (allowed_zero[i] or i >= len(self.synced))):
                continue
            return (f"byte {i} is {byte}, synced {self.synced[i] if i < len(self.synced) else None}, "
                    f"written since {sorted(touched.get(i, ()))[:5]}")
        return None


def crash_writer(w, seed, box, models, out):
    """Writes, truncates, syncs its own files until the mount goes away; sends back the models
    (the state of each file at its last returned sync, and what was written since)."""
    rng = random.Random(seed)
    fds = {}
    try:
        for k in range(CRASH_FILES):
            fds[k] = os.open(os.path.join(box, f"c{k}"), os.O_RDWR | os.O_CREAT, 0o644)
        while True:
            k = rng.randrange(CRASH_FILES)
            m, fd = models[k], fds[k]
            op = rng.choices(["pwrite", "append", "truncate", "fsync", "fdatasync", "msync", "fallocate"],
                             weights=CRASH_WEIGHTS)[0]
            if op in ("pwrite", "append"):
                off = rng.randrange(CRASH_MAX) if op == "pwrite" else len(m.cur)
                n = min(rng.choice([1, 100, 4096, 9000, 40000]), CRASH_MAX + 50000 - off)
                data = ro.payload(rng, n)[:n]
                m.write(off, data)  # in the model before the call: it may land even if the call fails
                os.pwrite(fd, data, off)
            elif op == "truncate":
                n = rng.randrange(CRASH_MAX)
                m.truncate(n)
                os.ftruncate(fd, n)
            elif op == "fallocate":
                end = rng.randrange(CRASH_MAX)
                if end > len(m.cur):
                    m.truncate(end)
                os.posix_fallocate(fd, 0, end)
            elif op == "msync":
                size = len(m.cur)
                if size:
                    off = rng.randrange(size)
                    data = ro.payload(rng, min(5000, size - off))[:size - off]
                    m.write(off, data)
                    # In a child: a store to the map after the daemon died is a SIGBUS.
                    pid = os.fork()
                    if pid == 0:
                        try:
                            with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mm:
                                mm[off:off + len(data)] = data
                                mm.flush()  # msync(MS_SYNC)
                            os._exit(0)
                        except BaseException:  # noqa: BLE001
                            os._exit(1)
                    if os.waitpid(pid, 0)[1] != 0:
                        raise OSError(errno.EIO, "the mapped write failed")
                    m.sync()
            else:
                (os.fsync if op == "fsync" else os.fdatasync)(fd)
                m.sync()
    except (OSError, ValueError):
        pass  # the mount went away
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    out.put((w, models))


def where(pid):
    """Where a stuck process waits: its kernel stack, or its wchan."""
    for f in ("stack", "wchan"):
        try:
            with open(f"/proc/{pid}/{f}") as fh:
                return fh.read().replace("\n", " | ")[:400]
        except OSError:
            pass
    return "?"


# ---------------------------------------------------------------- big directories

class Dir:
    """opendir/readdir/telldir/seekdir of libc (Python has no seekdir)."""
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.opendir.restype = ctypes.c_void_p
    _libc.opendir.argtypes = [ctypes.c_char_p]
    _libc.readdir.restype = ctypes.c_void_p
    _libc.readdir.argtypes = [ctypes.c_void_p]
    _libc.telldir.restype = ctypes.c_long
    _libc.telldir.argtypes = [ctypes.c_void_p]
    _libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    _libc.closedir.argtypes = [ctypes.c_void_p]
    NAME_AT = 19  # struct dirent (glibc, 64-bit): d_ino 8, d_off 8, d_reclen 2, d_type 1, d_name

    def __init__(self, path):
        self.d = self._libc.opendir(path.encode())
        if not self.d:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), path)

    def read(self):
        ent = self._libc.readdir(self.d)
        return None if not ent else ctypes.string_at(ent + self.NAME_AT).decode()

    def tell(self):
        return self._libc.telldir(self.d)

    def seek(self, pos):
        self._libc.seekdir(self.d, pos)

    def close(self):
        self._libc.closedir(self.d)


def run_bigdir(t, label, work, opts):
    """One local/ directory of opts.entries names (ghostfs started with a soft descriptor limit of
    1024, as systemd gives a service: every inode the kernel knows holds a descriptor), read in
    pieces while names before and among them come and go, with telldir/seekdir; names at
    NAME_MAX, a path near PATH_MAX; rm -rf of it all."""
    mnt, cache, ctl = (os.path.join(work, f"{x}-{label}-big") for x in ("mnt", "cache", "ctl"))
    os.makedirs(mnt)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        fs = start_mount(t, work, label, mnt, cache, ctl, "big directory", asleep=False)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if fs is None:
        t.skip_rest(t.n + 3, "not mounted")
        return
    big = os.path.join(mnt, "local", "big")
    os.makedirs(big)
    rng = random.Random(opts.seed + 3)
    n, failed, t0 = opts.entries, None, time.time()
    stable = [f"s{i:07d}" for i in range(n)]
    for name in stable:
        try:
            os.close(os.open(os.path.join(big, name), os.O_CREAT | os.O_WRONLY, 0o644))
        except OSError as e:
            failed = f"create {name}: {e}"
            break
    print(f"# [{label}] {n} entries created in {time.time() - t0:.1f} s", flush=True)
    t.check(failed is None, f"[{label}] {n} entries in one local/ directory under a soft limit of 1024 "
            "descriptors", failed)
    if failed:
        fs.stop()
        t.skip_rest(t.n + 3, "no big directory")
        return
    # Read in pieces; between pieces names sorted before and among the stable ones are created
    # and unlinked, and the stream is telldir'd and seekdir'd back. Every stable name must come
    # exactly once.
    problems, churn, seen, t0 = [], [], [], time.time()
    d = Dir(big)
    try:
        count = 0
        while True:
            if count % 97 == 0:
                for _ in range(5):
                    name = rng.choice(["a", "s", "z"]) + f"{rng.randrange(10 ** 7):07d}x"
                    os.close(os.open(os.path.join(big, name), os.O_CREAT | os.O_WRONLY, 0o644))
                    churn.append(name)
                for _ in range(min(len(churn), 4)):
                    os.unlink(os.path.join(big, churn.pop(rng.randrange(len(churn)))))
                pos = d.tell()
                ahead = [d.read() for _ in range(rng.randrange(1, 5))]
                d.seek(pos)  # back: the same names come again, once more, not twice after
                again = [d.read() for _ in range(len(ahead))]
                # A name created or removed since the opendir may or may not show (POSIX): `ahead`
                # can come from libc's buffer, filled before this round's churn, and `again` from
                # a fresh getdents that has it. The stable names must be the same.
                stable_ahead = [x for x in ahead if x is not None and not x.endswith("x")]
                stable_again = [x for x in again if x is not None and not x.endswith("x")]
                if stable_again[:len(stable_ahead)] != stable_ahead[:len(stable_again)]:
                    problems.append(f"after seekdir back: {ahead} then {again}")
                seen += [x for x in again if x is not None]
                count += len(again)
                if None in again:
                    break
            name = d.read()
            if name is None:
                break
            seen.append(name)
            count += 1
    finally:
        d.close()
    got = [x for x in seen if x.startswith("s") and not x.endswith("x")]
    dup, missing = len(got) - len(set(got)), len(set(stable) - set(got))
    if dup or missing:
        problems.append(f"{dup} stable names seen twice, {missing} never")
    print(f"# [{label}] read {len(seen)} names in {time.time() - t0:.1f} s with {len(churn)} churn names left", flush=True)
    t.check(not problems, f"[{label}] readdir in pieces with creates, unlinks and seekdir between them sees "
            f"each of the {n} names exactly once", "; ".join(problems[:3]))
    # ls while others create and unlink.
    stop, errs = threading.Event(), []

    def churner(k):
        r = random.Random(k)
        while not stop.is_set():
            p = os.path.join(big, f"{r.choice('asz')}{r.randrange(10 ** 7):07d}y{k}")
            try:
                os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
                os.unlink(p)
            except OSError as e:
                errs.append(str(e))
                return
    threads = [threading.Thread(target=churner, args=(k,)) for k in range(3)]
    for th in threads:
        th.start()
    rounds = []
    for _ in range(3):
        out = subprocess.run(["ls", "-1", "-f", big], capture_output=True, text=True, timeout=120).stdout.split()
        got = [x for x in out if x.startswith("s") and not x.endswith(("x", "y0", "y1", "y2"))]
        rounds.append((len(got) - len(set(got)), len(set(stable) - set(got))))
    stop.set()
    for th in threads:
        th.join()
    t.check(all(r == (0, 0) for r in rounds) and not errs,
            f"[{label}] ls while three threads create and unlink sees every name once (dup, missing: {rounds})",
            "; ".join(errs[:2]))
    # Names at NAME_MAX, a path near PATH_MAX, then rm -rf of it all.
    problems = []
    long_name = os.path.join(big, "n" * 255)
    with open(long_name, "wb") as f:
        f.write(b"name max")
    with open(long_name, "rb") as f:
        if f.read() != b"name max":
            problems.append("the NAME_MAX file reads back wrong")
    try:
        os.close(os.open(os.path.join(big, "n" * 256), os.O_CREAT | os.O_WRONLY, 0o644))
        problems.append("a 256-byte name was created")
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG:
            problems.append(f"a 256-byte name: {errno.errorcode.get(e.errno)}")
    deep, depth = os.path.join(big, "deep"), 0
    os.mkdir(deep)
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while len(deep) + 201 < 4000:
            os.mkdir("d" * 200, dir_fd=fd)
            nfd = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd, deep, depth = nfd, os.path.join(deep, "d" * 200), depth + 1
        with open(os.path.join(deep, "leaf"), "wb") as f:
            f.write(b"leaf")
        with open(os.path.join(deep, "leaf"), "rb") as f:
            if f.read() != b"leaf":
                problems.append("the deep leaf reads back wrong")
        try:
            os.mkdir(os.path.join(deep, "e" * 250))
            problems.append(f"a path of {len(deep) + 201} bytes was made")
        except OSError as e:
            if e.errno != errno.ENAMETOOLONG:
                problems.append(f"a path past PATH_MAX: {errno.errorcode.get(e.errno)}")
    finally:
        os.close(fd)
    r = subprocess.run(["rm", "-rf", big], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 or os.path.exists(big):
        problems.append(f"rm -rf: {r.returncode} {r.stderr[-300:]}")
    t.check(not problems, f"[{label}] a NAME_MAX name, a {len(deep)}-byte path {depth} deep, ENAMETOOLONG "
            "past them, and rm -rf of it all", "; ".join(problems[:3]))
    fs.stop()


# ---------------------------------------------------------------- main

def start_mount(t, work, label, mnt, cache, ctl, tag, problems=None, asleep=True):
    """The mounted Ghostfs, or None: then a failed check (or a line in `problems`) says why."""
    args = [a.replace("{work}", work).replace("{label}", label) for a in MODES[label]]
    fs = h.Ghostfs(mnt, cache, {}, args=args, control=ctl)
    if fs.start(20):
        if MODES[label] and asleep:
            # Start with the emulated disk asleep: writes wait in the queue (or go to the flash
            # log) until an fsync, a flush or the cap spins it up.
            c = h.Control(ctl)
            h.wait_for(lambda: [d for d in c.ok("devices") if d["kind"] == "disk"][0]["mode"] == "standby", 20)
            c.close()
        return fs
    if problems is None:
        t.check(False, f"[{label}] {tag}: mounts", fs.output()[-2000:])
    else:
        problems.append(f"{tag}: no mount: {fs.output()[-500:]}")
    return None


def run_differential(t, label, work, opts):
    mnt, cache, ctl = (os.path.join(work, f"{x}-{label}") for x in ("mnt", "cache", "ctl"))
    os.makedirs(mnt)
    fs = start_mount(t, work, label, mnt, cache, ctl, "differential")
    if fs is None:
        t.skip_rest(t.n + 3, "not mounted")
        return
    box, plain = os.path.join(mnt, "local", "cc"), os.path.join(work, f"plain-{label}")
    shared = os.path.join(box, "shared")
    os.makedirs(shared)
    flip = Flipper(ctl, opts.seed + 1)
    flip.start()
    q = mp.Queue()
    procs = []
    for w in range(opts.procs):
        mb, pb = os.path.join(box, f"w{w}"), os.path.join(plain, f"w{w}")
        os.makedirs(os.path.join(mb, "top"))
        os.makedirs(os.path.join(pb, "top"))
        p = mp.Process(target=worker, args=(w, opts.seed, opts.ops, mb, pb, shared, opts.procs, q, False))
        p.start()
        procs.append(p)
    results, deadline, mism = {}, time.time() + opts.timeout, []
    while len(results) < len(procs) and time.time() < deadline:
        try:
            r = q.get(timeout=1)
            results[r[0]] = r
        except Exception:  # noqa: BLE001 - queue.Empty
            # Nothing for a second and every worker still owing a result is gone: none comes.
            if all(not procs[w].is_alive() for w in range(len(procs)) if w not in results):
                break
    flip.stop.set()
    flip.join(30)
    hung = [w for w in range(len(procs)) if w not in results]
    # A worker that is gone without a result did not hang: it died (e.g. SIGBUS from an mmap
    # access past a size the kernel was told was shorter).
    died = {w: procs[w].exitcode for w in hung if not procs[w].is_alive()}
    hung = [w for w in hung if w not in died]
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    for w, code in sorted(died.items()):
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        mism.append(f"w{w} died ({how}) without a result")
    mism += [r[1] for r in results.values() if r[1]]
    print(f"# [{label}] {opts.procs} processes x {opts.ops} ops, done {[r[4] for r in results.values()]}; "
          f"power flips {len(flip.done)} ({', '.join(sorted(set(flip.done)))}), errors {flip.errors[:3]}", flush=True)
    t.check(not hung and not mism, f"[{label}] concurrent sequences give the same results as a plain directory",
            f"hung {hung}; " + "; ".join(mism[:4]))
    trees_ok = True
    diffs = []
    for w in range(opts.procs):
        ta, tb = ro.tree(os.path.join(box, f"w{w}")), ro.tree(os.path.join(plain, f"w{w}"))
        d = {k: (ta.get(k), tb.get(k)) for k in set(ta) | set(tb) if ta.get(k) != tb.get(k)}
        if d and not results.get(w, (0, "x"))[1]:
            trees_ok = False
            diffs.append(f"w{w}: {ro.short(d)}")
    t.check(trees_ok, f"[{label}] the final trees are the plain directory's", "; ".join(diffs[:3]))
    if label == "flash":
        fl = h.Control(ctl).ok("stats").get("flash_log") or {}
        t.check(fl.get("appends", 0) > 0 and fl.get("append_failures") == 0,
                f"[{label}] the writes went through the flash log ({fl.get('appends')} appends, flushes "
                f"{fl.get('flushes')})", ro.short(fl))
    counts = {w: (r[2], r[3]) for w, r in results.items()}
    probs = check_shared(shared, counts, opts.procs)
    t.check(not probs, f"[{label}] the shared log holds every record whole, once; the grid every block "
            f"({sum(c[0] for c in counts.values())} records, {sum(c[1] for c in counts.values())} blocks)",
            "; ".join(probs[:4]))
    # After a clean unmount and mount the same.
    fs.stop()
    fs = start_mount(t, work, label, mnt, cache, ctl, "remount", probs := [])
    if fs is None:
        t.check(False, f"[{label}] after unmount and mount the trees and shared files are the same", probs[0])
        return
    probs = check_shared(shared, counts, opts.procs)
    for w in range(opts.procs):
        ta, tb = ro.tree(os.path.join(box, f"w{w}")), ro.tree(os.path.join(plain, f"w{w}"))
        if ta != tb and not results.get(w, (0, "x"))[1]:
            probs.append(f"w{w} tree differs")
    t.check(not probs, f"[{label}] after unmount and mount the trees and shared files are the same",
            "; ".join(probs[:4]))
    fs.stop()


def run_crashes(t, label, work, opts):
    mnt, cache, ctl = (os.path.join(work, f"{x}-{label}-crash") for x in ("mnt", "cache", "ctl"))
    os.makedirs(mnt)
    rng = random.Random(opts.seed + 7)
    models = {w: {k: Model() for k in range(CRASH_FILES)} for w in range(opts.procs)}
    problems, index_problems, cycles = [], [], 0
    for cycle in range(opts.cycles):
        fs = start_mount(t, work, label, mnt, cache, ctl, f"cycle {cycle}", problems)
        if fs is None:
            break
        box = os.path.join(mnt, "local", "crash")
        os.makedirs(box, exist_ok=True)
        # Check what the last cycle left, then take it as the new synced state.
        for w in range(opts.procs):
            wb = os.path.join(box, f"w{w}")
            os.makedirs(wb, exist_ok=True)
            for k, m in models[w].items():
                p = os.path.join(wb, f"c{k}")
                try:
                    with open(p, "rb") as f:
                        got = f.read()
                except FileNotFoundError:
                    got = None
                if got is None:
                    if m.synced or any(True for _ in m.since) and len(m.synced):
                        problems.append(f"cycle {cycle}: w{w}/c{k} is gone ({len(m.synced)} synced bytes)")
                    got = b""
                else:
                    why = m.check(got)
                    if why:
                        problems.append(f"cycle {cycle}: w{w}/c{k}: {why}")
                if got is not None:
                    with open(p, "ab") as f:
                        os.fsync(f.fileno())
                models[w][k] = Model(got)
        if problems:
            fs.stop()
            break
        flip = Flipper(ctl, opts.seed + 100 + cycle)
        flip.start()
        q = mp.Queue()
        procs = [mp.Process(target=crash_writer, args=(w, opts.seed * 7919 + cycle * 31 + w,
                                                       os.path.join(box, f"w{w}"), models[w], q))
                 for w in range(opts.procs)]
        # The differential load beside them (results not compared: the mount dies under it).
        for w in range(opts.procs // 2):
            mb = os.path.join(box, f"load{cycle}-{w}")
            pb = os.path.join(work, f"crash-plain-{label}", f"load{cycle}-{w}")
            os.makedirs(os.path.join(mb, "top"), exist_ok=True)
            os.makedirs(os.path.join(pb, "top"), exist_ok=True)
            sh = os.path.join(box, "shared")
            os.makedirs(sh, exist_ok=True)
            procs.append(mp.Process(target=worker, args=(w, opts.seed + cycle, 10 ** 9, mb, pb, sh, opts.procs,
                                                         mp.Queue(), True)))
        for p in procs:
            p.start()
        time.sleep(rng.uniform(0.3, opts.crash_after))
        fs.kill9()
        flip.stop.set()
        got = {}
        deadline = time.time() + 60
        while len(got) < opts.procs and time.time() < deadline:
            try:
                w, ms = q.get(timeout=1)
                got[w] = ms
            except Exception:  # noqa: BLE001
                pass
        stuck = []
        for p in procs:
            p.join(5)
            if p.is_alive():
                stuck.append(f"pid {p.pid} in {where(p.pid)}")
                p.kill()
                p.join()
        flip.join(30)
        if len(got) < opts.procs:
            problems.append(f"cycle {cycle}: {opts.procs - len(got)} writers hung after the kill: {stuck}, "
                            f"exit codes {[p.exitcode for p in procs[:opts.procs]]}")
            break
        models = got
        index_problems += [f"cycle {cycle}: {p}" for p in h.index_problems(cache)]
        cycles += 1
    else:
        fs = start_mount(t, work, label, mnt, cache, ctl, "final", problems)
        if fs:
            box = os.path.join(mnt, "local", "crash")
            for w in range(opts.procs):
                for k, m in models[w].items():
                    try:
                        with open(os.path.join(box, f"w{w}", f"c{k}"), "rb") as f:
                            why = m.check(f.read())
                    except FileNotFoundError:
                        why = "gone" if m.synced else None
                    if why:
                        problems.append(f"final: w{w}/c{k}: {why}")
            fs.stop()
    print(f"# [{label}] {cycles} crash cycles", flush=True)
    t.check(not problems, f"[{label}] after {cycles} SIGKILLs every synced byte is there and no other byte "
            "appears", "; ".join(problems[:4]))
    t.check(not index_problems, f"[{label}] the index passes integrity_check after every kill",
            "; ".join(index_problems[:4]))


def main():
    opts = h.seeded_options(procs=4, ops=300, cycles=2, crash_after=1.5, timeout=120.0,
                            modes="plain,profile,flash", entries=1200, parts="differential,crash,bigdir")
    h.require_root_and_fuse()
    modes = opts.modes.split(",")
    parts = opts.parts.split(",")
    t = h.Tap(len(modes) * (4 * ("differential" in parts) + 2 * ("crash" in parts) + 4 * ("bigdir" in parts))
              + ("flash" in modes and "differential" in parts))
    work = h.tempdir()
    for label in modes:
        for part, run in (("differential", run_differential), ("crash", run_crashes), ("bigdir", run_bigdir)):
            if part in parts:
                t0 = time.time()
                run(t, label, work, opts)
                print(f"# [{label}] {part}: {time.time() - t0:.1f} s", flush=True)
    t.done()


if __name__ == "__main__":
    # meson stops the test at 240 s: before that, a hang reports where it waits
    with h.Watchdog(210, h.tracked_alive):
        main()
