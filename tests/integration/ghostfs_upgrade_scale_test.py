#!/usr/bin/env python3
"""The first mount of a cache written by an older ghost (index schema 4: key as primary key,
4 KiB pages; common/cache/cache_store.cc, CopyIntoVersion5) at scale: 20,000 packed 512-byte
objects with their proxy response heads (GHOST_UPGRADE_SCALE_OBJECTS=N for another size). The
upgrade copies the rows once into a new file and renames it over the old one: the mount is ready
(mounted and answering `stats`) with every object, sampled bodies read back byte-identical with
their ETags, no partial copy is left, and a second mount is ready at once. The in-place rebuild
plus VACUUM it replaces took 48.9 s for 100k objects on a loaded machine. TAP; skipped without
root, /dev/fuse or nginx."""
import json
import os
import random
import sqlite3
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 4
OBJECTS = int(os.environ.get("GHOST_UPGRADE_SCALE_OBJECTS", "20000"))


def body_of(i):
    return (f"{i:08d}" * 64).encode()


def key_of(i):
    return f"http://127.0.0.1:50031/o/{i % 2}/{i // 2}"


def etag_of(i):
    return f'"6b07e9c8-{i}"'


def write_version4(index, n):
    """A schema-4 index as an older ghostproxy fill left it (heads as TEXT)."""
    db = sqlite3.connect(index)
    db.executescript(
        "PRAGMA page_size = 4096; PRAGMA journal_mode = WAL; "
        "CREATE TABLE schema_version(version INTEGER NOT NULL); "
        "INSERT INTO schema_version VALUES(4); "
        "CREATE TABLE objects(key TEXT PRIMARY KEY NOT NULL, size INTEGER NOT NULL, "
        "etag TEXT NOT NULL DEFAULT '', last_modified TEXT NOT NULL DEFAULT '', "
        "content_type TEXT NOT NULL DEFAULT '', expires_us INTEGER, fetched_us INTEGER NOT NULL, "
        "accessed_us INTEGER NOT NULL, complete INTEGER NOT NULL, "
        "response TEXT NOT NULL DEFAULT '', h INTEGER, body BLOB); "
        "CREATE INDEX objects_table ON objects(complete, h, size, accessed_us); "
        "CREATE TABLE shutdown(clean INTEGER NOT NULL); INSERT INTO shutdown VALUES(1);")
    now = int(time.time())
    lm = "Thu, 26 Nov 2026 08:11:52 GMT"

    def rows():
        for i in range(n):
            head = json.dumps({
                "expires_unix": now + 3600, "status": 200, "stored_unix": now,
                "headers": [["Server", "nginx/1.22.1"], ["Date", "Thu, 26 Nov 2026 08:11:53 GMT"],
                            ["Content-Type", "application/octet-stream"], ["Content-Length", "512"],
                            ["Last-Modified", lm], ["ETag", etag_of(i)],
                            ["Expires", "Thu, 26 Nov 2026 09:11:53 GMT"],
                            ["Cache-Control", "max-age=3600"], ["Accept-Ranges", "bytes"]]})
            yield (key_of(i), 512, etag_of(i), lm, "application/octet-stream",
                   (now + 3600) * 10**6, now * 10**6, now * 10**6 + i, 1, head,
                   h.ghost_key_hash(key_of(i)), body_of(i))
    with db:
        db.executemany("INSERT INTO objects VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows())
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def main():
    work, _root, _sums, nginx = h.serve_tree()
    t = h.Tap(PLAN)
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    sock = os.path.join(work, "control.sock")
    cache = os.path.join(work, "cache")
    index = os.path.join(cache, "objects-db", "index.sqlite")
    os.makedirs(os.path.dirname(index))
    write_version4(index, OBJECTS)

    fs = h.Ghostfs(mnt, cache, {"www": nginx.url()}, control=sock)
    first_s, first_n = fs.start_ready(timeout=600)
    if not t.check(first_n == OBJECTS,
                   f"the first mount of a schema-4 cache of {OBJECTS} objects is ready in "
                   f"{first_s} s (CPU {getattr(fs, 'ready_cpu_s', None)} s) with {first_n} objects",
                   fs.output()[-2000:]):
        t.skip_rest(PLAN - 1, "not mounted")
        t.done()

    bad = []
    ctl = h.Control(sock)
    for i in random.Random(5).sample(range(OBJECTS), 50):
        got = ctl.ok("lookup", key=key_of(i))
        try:
            with open(got["path"], "rb") as f:
                data = f.read()
        except (KeyError, OSError) as e:
            bad.append(f"{i}: {e} {got}")
            continue
        if data != body_of(i) or got.get("etag") != etag_of(i):
            bad.append(f"{i}: {len(data)} bytes, etag {got.get('etag')}")
    ctl.close()
    t.check(not bad, "50 upgraded objects read back byte-identical with their ETags", bad[:5])

    fs.stop()  # the index is locked while mounted
    db = sqlite3.connect(index)
    version = db.execute("SELECT max(version) FROM schema_version").fetchone()[0]
    page = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    t.check(version == 5 and page == 16384 and not os.path.exists(index + ".v5"),
            f"the index is version {version} with {page}-byte pages, no partial copy left")

    fs = fs.again()
    again_s, again_n = fs.start_ready(timeout=600)
    t.check(again_n == OBJECTS and again_s is not None and again_s < 5,
            f"the next mount is ready in {again_s} s (CPU {getattr(fs, 'ready_cpu_s', None)} s) "
            f"with {again_n} objects", fs.output()[-2000:])
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
