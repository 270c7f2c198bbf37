#!/usr/bin/env python3
"""Crash loop: ghostfs is killed with SIGKILL while it takes fsync'd
writes in local/ and cache fills (reads of uncached origin files), with and without
`--profile ipaq-2004` (writes deferred in the write queue), and restarted on the same cache
directory each cycle. After every kill: the cache index passes sqlite's
`PRAGMA integrity_check`, and every complete row's body (its file, or the bytes packed in the
row for a small one) has the row's size and the origin's bytes. After every restart: every
byte whose fsync returned is there.

    ghostfs_crash_test.py [CYCLES]   (default 10, or $GHOST_CRASH_CYCLES; 100 for a long run)
TAP; skipped without root, /dev/fuse or nginx."""
import hashlib
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

ORIGIN_FILES = 400


def check_index(cache, origin_sums, base_url):
    """(problems, complete rows) of the cache index after a crash."""
    problems = []
    db_path = os.path.join(cache, "objects-db", "index.sqlite")
    if not os.path.exists(db_path):
        return ["no index.sqlite"], 0
    db = sqlite3.connect(db_path)
    try:
        verdict = db.execute("PRAGMA integrity_check").fetchone()[0]
        if verdict != "ok":
            problems.append(f"integrity_check: {verdict}")
        rows = db.execute("SELECT key, size, body FROM objects WHERE complete = 1").fetchall()
    finally:
        db.close()
    for key, size, packed in rows:
        name = hashlib.sha256(key.encode()).hexdigest()
        body = os.path.join(cache, "objects-db", "objects", name[:2], name)
        try:
            if packed is not None:
                data = bytes(packed)
            else:
                with open(body, "rb") as f:
                    data = f.read()
        except OSError as e:
            problems.append(f"{key}: indexed, body unreadable: {e}")
            continue
        if len(data) != size:
            problems.append(f"{key}: indexed size {size}, body {len(data)} bytes")
        rel = key[len(base_url):] if key.startswith(base_url) else None
        if rel in origin_sums and hashlib.sha256(data).hexdigest() != origin_sums[rel]:
            problems.append(f"{key}: body differs from the origin's")
    return problems, len(rows)


def check_acked(local, acked):
    """Files whose fsync returned that are missing or differ."""
    lost = []
    for rel, digest in acked.items():
        try:
            with open(os.path.join(local, rel), "rb") as f:
                data = f.read()
        except OSError as e:
            lost.append((rel, str(e)))
            continue
        if hashlib.sha256(data).hexdigest() != digest:
            lost.append((rel, f"{len(data)} bytes, content differs"))
    return lost


def main():
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("GHOST_CRASH_CYCLES", "10"))
    h.require_root_and_fuse()
    work = h.tempdir()
    site = os.path.join(work, "site")
    os.makedirs(site)
    rng = random.Random(12)
    origin_sums = {}
    for i in range(ORIGIN_FILES):
        data = rng.randbytes(rng.randrange(1_000, 400_000))
        with open(os.path.join(site, f"f{i:03d}.bin"), "wb") as f:
            f.write(data)
        origin_sums[f"f{i:03d}.bin"] = hashlib.sha256(data).hexdigest()
    nginx = h.started_nginx(site)
    plan = 2 * cycles + 2
    t = h.Tap(plan)
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    cache = os.path.join(work, "cache")
    acked = {}  # local/ relative path -> sha256 of what its last fsync covered
    acked_bytes = 0
    fills_read = 0
    next_origin = 0
    total_rows = 0
    for cycle in range(cycles):
        args = ["--profile", "ipaq-2004"] if cycle % 2 else []
        fs = h.Ghostfs(mnt, cache, {"www": nginx.url()}, args=args)
        if not fs.start(timeout=20):
            t.check(False, f"cycle {cycle}: ghostfs restarts on the same cache", fs.output()[-2000:])
            t.skip_rest(plan - 2 * cycle - 1, "ghostfs did not restart")
            t.done()
        local = os.path.join(mnt, "local")
        if cycle == 0:  # nothing acknowledged yet: what there is to check is that nothing is there
            names = os.listdir(local)
            t.check(not names, "cycle 0: local/ of the fresh cache is empty", names[:5])
        elif not acked:
            t.skip(f"cycle {cycle}: every fsync'd byte of the earlier cycles is there", "no fsync returned before a kill yet")
        else:
            lost = check_acked(local, acked)
            t.check(not lost, f"cycle {cycle}: every fsync'd byte of the earlier cycles is there "
                    f"({len(acked)} files)", lost[:5])
        stop = threading.Event()
        crng = random.Random(cycle)
        in_flight = []  # the file being (re)written when the kill came: its state is undefined

        def writer():
            nonlocal acked_bytes
            d = os.path.join(local, f"c{cycle:03d}")
            os.makedirs(d, exist_ok=True)
            n = 0
            while not stop.is_set():
                rel = f"c{cycle:03d}/w{n:04d}"
                if n > 2 and crng.random() < 0.2:
                    rel = f"c{cycle:03d}/w{crng.randrange(n):04d}"  # rewrite an acked file
                data = crng.randbytes(crng.randrange(1, 150_000))
                in_flight[:] = [rel]
                try:
                    fd = os.open(os.path.join(local, rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        os.write(fd, data)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                except OSError:
                    return  # the daemon is gone
                acked[rel] = hashlib.sha256(data).hexdigest()
                in_flight[:] = []
                acked_bytes += len(data)
                n += 1

        def reader():
            nonlocal next_origin, fills_read
            while not stop.is_set():
                name = f"f{next_origin % ORIGIN_FILES:03d}.bin"
                next_origin += 1
                try:
                    with open(os.path.join(mnt, "www", name), "rb") as f:
                        f.read()
                    fills_read += 1
                except OSError:
                    return

        threads = [threading.Thread(target=writer), threading.Thread(target=reader),
                   threading.Thread(target=reader)]
        for th in threads:
            th.start()
        time.sleep(crng.uniform(0.5, 2.0))
        fs.proc.kill()  # SIGKILL under load
        fs.proc.wait()
        stop.set()
        for th in threads:
            th.join(30)
        for rel in in_flight:
            # Truncated and rewritten, but its fsync never returned: old bytes, new bytes or
            # part of them are all allowed; what was acknowledged before is not promised.
            acked.pop(rel, None)
        subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        fs.proc = None
        problems, rows = check_index(cache, origin_sums, nginx.url() + "")
        total_rows = rows
        t.check(not problems, f"cycle {cycle}{' (ipaq-2004)' if args else ''}: after SIGKILL the index "
                f"is intact and its {rows} bodies match the origin", problems[:5])
    fs = h.Ghostfs(mnt, cache, {"www": nginx.url()})
    ok = fs.start(timeout=20)
    lost = check_acked(os.path.join(mnt, "local"), acked) if ok else ["not mounted"]
    t.check(ok and acked and not lost, f"after {cycles} kills: 0 of {len(acked)} fsync'd files ({acked_bytes} bytes "
            "acknowledged) lost", lost[:5])
    print(f"# {cycles} cycles: {len(acked)} fsync'd files, {acked_bytes} bytes acknowledged, {len(lost)} lost; "
          f"{fills_read} origin reads, {total_rows} cached objects at the last check", flush=True)
    bad = []
    if ok:
        for name, digest in list(origin_sums.items())[:50]:
            with open(os.path.join(mnt, "www", name), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != digest:
                    bad.append(name)
    t.check(ok and not bad, "origin files read back intact after the crashes", bad[:5])
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
