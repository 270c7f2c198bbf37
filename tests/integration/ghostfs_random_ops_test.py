#!/usr/bin/env python3
"""A random-operation file test of local/ (after fsx): one seeded sequence of operations —
opens with every access mode, reads, writes, appends, truncates, mmap reads and writes, renames
(plain, RENAME_NOREPLACE, RENAME_EXCHANGE), unlinks of open files, hard links, symlinks,
mkdir/rmdir, fsync — runs on MOUNT/local and on a plain temporary directory side by side. Every
result (the value, or the errno) must be the same on both, and so must the final trees (types,
sizes, contents, link targets, link counts). Runs without a profile and with --profile
ipaq-2004 (writes then wait in the write queue and reads overlay them).

CI size by default; longer runs: ghostfs_random_ops_test.py --ops 100000 --seed 7.
TAP; skipped without root or /dev/fuse."""
import argparse
import ctypes
import errno
import mmap
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
DIRS = ["", "d0", "d1", "d0/e"]
FILES = [f"f{i}" for i in range(5)]
SLOTS = 6
MAX_SIZE = 300_000
OPEN_FLAGS = [os.O_RDWR | os.O_CREAT, os.O_RDONLY, os.O_WRONLY | os.O_CREAT, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
              os.O_RDWR | os.O_TRUNC, os.O_RDWR | os.O_CREAT | os.O_EXCL, os.O_RDONLY | os.O_TRUNC]
# label → extra ghostfs arguments; "{work}" is the test's scratch directory. The flash mode's
# log is small so that it fills and flushes to the sleeping disk in the middle of the sequence.
MODES = (("plain", []), ("profile", ["--profile", "ipaq-2004", "--knob", "50"]),
         ("flash", ["--profile", "ipaq-2004", "--knob", "50", "--flash-log", "{work}/flash:256K"]))
_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old, new, flags):
    if _libc.renameat2(-100, old.encode(), -100, new.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Side:
    """One directory and the descriptors open in it (slot → fd)."""

    def __init__(self, root):
        self.root = root
        self.fds = {}

    def p(self, rel):
        return os.path.join(self.root, rel)

    def close_all(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


def payload(rng, n):
    return bytes(rng.getrandbits(8) for _ in range(min(n, 64))) * (n // 64 + 1)


def make_op(rng, open_slots):
    """One operation as (name, args): the choice depends only on the rng and the slots open."""
    path = lambda: "/".join(x for x in (rng.choice(DIRS), rng.choice(FILES)) if x)  # noqa: E731
    slot = rng.choice(open_slots) if open_slots and rng.random() < 0.9 else rng.randrange(SLOTS)
    kind = rng.choices(
        ["open", "close", "pwrite", "write", "pread", "ftruncate", "truncate", "fstat", "stat", "rename",
         "unlink", "link", "symlink", "readlink", "mkdir", "rmdir", "mmap_read", "mmap_write", "fsync", "listdir"],
        weights=[10, 6, 14, 5, 12, 4, 2, 4, 3, 5, 4, 2, 1, 1, 1, 1, 4, 4, 2, 1])[0]
    if kind == "open":
        return kind, (rng.randrange(SLOTS), path(), rng.choice(OPEN_FLAGS))
    if kind in ("close", "fstat", "fsync"):
        return kind, (slot,)
    if kind == "pwrite":
        return kind, (slot, rng.randrange(MAX_SIZE), payload(rng, rng.choice([1, 100, 4096, 5000, 70000])))
    if kind == "write":
        return kind, (slot, payload(rng, rng.choice([1, 333, 8192])))
    if kind == "pread":
        return kind, (slot, rng.randrange(MAX_SIZE), rng.choice([1, 100, 4096, 70000, 300000]))
    if kind == "ftruncate":
        return kind, (slot, rng.randrange(MAX_SIZE))
    if kind == "truncate":
        return kind, (path(), rng.randrange(MAX_SIZE))
    if kind in ("stat", "unlink", "readlink"):
        return kind, (path(),)
    if kind == "rename":
        a = path() if rng.random() < 0.85 else rng.choice(DIRS[1:])
        return kind, (a, path(), rng.choice([0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]))
    if kind == "link":
        return kind, (path(), path())
    if kind == "symlink":
        target, where = rng.choice(FILES + ["../f0", "nowhere"]), path()
        if "/" not in where and target.startswith("../"):
            target = target[3:]  # stay inside the tree under test
        return kind, (target, where)
    if kind in ("mkdir", "rmdir", "listdir"):
        return kind, (rng.choice(DIRS[1:]) if kind != "listdir" else rng.choice(DIRS),)
    if kind == "mmap_read":
        return kind, (slot, rng.randrange(MAX_SIZE), rng.choice([1, 4096, 10000]))
    if kind == "mmap_write":
        return kind, (slot, rng.randrange(MAX_SIZE), payload(rng, rng.choice([1, 100, 5000])))
    raise AssertionError(kind)


def apply(side, name, args):
    """Runs one operation on `side`; returns ("ok", value) or ("err", errno name)."""
    try:
        return "ok", _apply(side, name, args)
    except OSError as e:
        return "err", errno.errorcode.get(e.errno, str(e.errno))
    except ValueError as e:  # mmap of an empty range and the like: same on both sides
        return "value-error", str(e)


def fd_of(side, slot):
    if slot not in side.fds:
        raise OSError(errno.EBADF, "slot not open")
    return side.fds[slot]


def stat_tuple(st):
    return (st.st_mode & 0o170777, st.st_size if not os.path.stat.S_ISDIR(st.st_mode) else -1, st.st_nlink)


def _apply(side, name, args):
    if name == "open":
        slot, rel, flags = args
        fd = os.open(side.p(rel), flags, 0o644)
        if slot in side.fds:
            os.close(side.fds[slot])
        side.fds[slot] = fd
        return None
    if name == "close":
        fd = fd_of(side, args[0])
        del side.fds[args[0]]
        os.close(fd)
        return None
    if name == "pwrite":
        return os.pwrite(fd_of(side, args[0]), args[2], args[1])
    if name == "write":
        return os.write(fd_of(side, args[0]), args[1])
    if name == "pread":
        return os.pread(fd_of(side, args[0]), args[2], args[1])
    if name == "ftruncate":
        return os.ftruncate(fd_of(side, args[0]), args[1])
    if name == "truncate":
        return os.truncate(side.p(args[0]), args[1])
    if name == "fstat":
        return stat_tuple(os.fstat(fd_of(side, args[0])))
    if name == "stat":
        return stat_tuple(os.lstat(side.p(args[0])))
    if name == "rename":
        return renameat2(side.p(args[0]), side.p(args[1]), args[2])
    if name == "unlink":
        return os.unlink(side.p(args[0]))
    if name == "link":
        return os.link(side.p(args[0]), side.p(args[1]), follow_symlinks=False)
    if name == "symlink":
        return os.symlink(args[0], side.p(args[1]))
    if name == "readlink":
        return os.readlink(side.p(args[0]))
    if name == "mkdir":
        return os.mkdir(side.p(args[0]), 0o755)
    if name == "rmdir":
        return os.rmdir(side.p(args[0]))
    if name == "listdir":
        return sorted(os.listdir(side.p(args[0])))
    if name == "fsync":
        return os.fsync(fd_of(side, args[0]))
    if name == "mmap_read":
        fd = fd_of(side, args[0])
        size = os.fstat(fd).st_size
        if size == 0:
            return b""
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            off = args[1] % size
            return m[off:off + args[2]]
    if name == "mmap_write":
        fd = fd_of(side, args[0])
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            off = args[1] % size
            data = args[2][:size - off]
            m[off:off + len(data)] = data
            m.flush()
            return len(data)
    raise AssertionError(name)


def tree(root):
    """The whole tree: relative path → (type, size, nlink, content or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if os.path.stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif os.path.stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_mode & 0o7777, st.st_nlink)
            else:
                with open(p, "rb") as f:
                    data = f.read()
                out[rel] = ("file", st.st_mode & 0o7777, st.st_nlink, len(data), hash(data))
    return out


def short(v):
    s = repr(v)
    return s if len(s) < 200 else s[:200] + f"... ({len(s)} chars)"


def run_sequence(t, label, local_box, plain_box, seed, ops):
    rng = random.Random(seed)
    a, b = Side(os.path.join(local_box, "top")), Side(os.path.join(plain_box, "top"))
    for d in DIRS[1:]:
        for s in (a, b):
            os.makedirs(s.p(d), exist_ok=True)
    mismatch = None
    counts = {}
    for i in range(ops):
        name, args = make_op(rng, sorted(a.fds))
        ra, rb = apply(a, name, args), apply(b, name, args)
        counts[name] = counts.get(name, 0) + 1
        if ra != rb or sorted(a.fds) != sorted(b.fds):
            mismatch = f"op {i} {name}{short(args)}: local/ {short(ra)}, plain {short(rb)}"
            break
    a.close_all()
    b.close_all()
    print(f"# [{label}] seed {seed}: {sum(counts.values())} ops {sorted(counts.items())}", flush=True)
    t.check(mismatch is None, f"[{label}] every operation gives the same result on local/ and a plain directory",
            mismatch)
    ta, tb = tree(local_box), tree(plain_box)
    diff = {k: (ta.get(k), tb.get(k)) for k in set(ta) | set(tb) if ta.get(k) != tb.get(k)}
    t.check(not diff, f"[{label}] the final trees are the same (types, sizes, contents, links)", short(diff))
    return tb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--ops", type=int, default=4000)
    opts = ap.parse_args()
    h.require_root_and_fuse()
    plan = 4 * len(MODES) + sum(1 for label, _ in MODES if label == "flash")
    t = h.Tap(plan)
    work = h.tempdir()
    for label, args in MODES:
        mnt = os.path.join(work, f"mnt-{label}")
        os.makedirs(mnt)
        ctl = os.path.join(work, f"ctl-{label}.sock") if args else None
        args = [a.replace("{work}", work) for a in args]
        fs = h.Ghostfs(mnt, os.path.join(work, f"cache-{label}"), {}, args=args, control=ctl)
        if not t.check(fs.start(), f"[{label}] mounts", fs.output()):
            t.skip_rest(t.n + 3 + (label == "flash"), "not mounted")
            continue
        if ctl:
            # Start with the emulated disk asleep: writes wait in the queue until an fsync or a
            # truncate (or the cap) spins it up.
            c = h.Control(ctl)
            h.wait_for(lambda: [d for d in c.ok("devices") if d["kind"] == "disk"][0]["mode"] == "standby", 20)
        # The trees under test are one level down in a sandbox of their own: a symlink "../f0"
        # that renames carry to the top resolves to the sandbox's f0 on both sides alike.
        local_box = os.path.join(mnt, "local", "fsx")
        plain_box = os.path.join(work, f"plain-{label}")
        for box in (local_box, plain_box):
            os.makedirs(os.path.join(box, "top"))
        expected = run_sequence(t, label, local_box, plain_box, opts.seed, opts.ops)
        if label == "flash":
            # The mode tests the log only if the writes went through it and it filled and was
            # flushed to the disk in the middle of the sequence.
            fl = h.Control(ctl).ok("stats").get("flash_log") or {}
            flushes = sum((fl.get("flushes") or {}).values())
            t.check(fl.get("appends", 0) > 0 and flushes > 0 and fl.get("append_failures") == 0
                    and fl.get("records_kept") == 0 and fl.get("corrupt_regions") == 0,
                    f"[{label}] the writes went through the flash log, which filled and was flushed "
                    f"({fl.get('appends')} appends, flushes {fl.get('flushes')})", short(fl))
        # What was written must survive a clean unmount: the write queue (and the flash log)
        # is flushed or replayed, and the next mount shows the same tree.
        fs.stop()
        if not fs.start():
            t.check(False, f"[{label}] after an unmount and a mount the tree is the same", fs.output())
        else:
            ta = tree(local_box)
            diff = {k: (ta.get(k), expected.get(k)) for k in set(ta) | set(expected) if ta.get(k) != expected.get(k)}
            t.check(not diff, f"[{label}] after an unmount and a mount the tree is the same", short(diff))
        fs.stop()
    t.done()


if __name__ == "__main__":
    main()
