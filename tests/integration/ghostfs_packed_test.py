#!/usr/bin/env python3
"""Small bodies packed in the cache index (common/cache/cache_store.h, pack_limit): an origin
file under 16 KiB read through the mount is cached in its index row with no body file, a larger
one keeps its file; both read back the origin's bytes after a clean remount (which checks no
body file) and after a SIGKILL (which checks them all). Through the store the proxy uses, a
packed object's lookup has no body_path but the bytes (body_base64), and its versioned path
reads the packed bytes.
TAP; skipped without root, /dev/fuse or nginx."""
import base64
import hashlib
import os
import sqlite3
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 12


def rows(cache):
    """{key: (size, packed bytes or None)} of the complete rows (ghostfs must be stopped)."""
    db = sqlite3.connect(os.path.join(cache, "objects-db", "index.sqlite"))
    try:
        return {k: (s, None if b is None else bytes(b))
                for k, s, b in db.execute("SELECT key, size, body FROM objects WHERE complete = 1")}
    finally:
        db.close()


def body_file(cache, key):
    name = hashlib.sha256(key.encode()).hexdigest()
    return os.path.join(cache, "objects-db", "objects", name[:2], name)


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    site = os.path.join(work, "site")
    os.makedirs(site)
    small, large = os.urandom(700), os.urandom(100_000)
    for name, data in (("small.bin", small), ("large.bin", large)):
        with open(os.path.join(site, name), "wb") as f:
            f.write(data)
    nginx = h.started_nginx(site)
    t = h.Tap(PLAN)
    fs, mnt, sock = h.mount_origin(t, PLAN, work, nginx.url(), check="mounts")
    cache = fs.cache
    for name in ("small.bin", "large.bin"):
        h.read_bytes(os.path.join(mnt, "www", name))  # fills the cache
    # The proxy's store: a small object stored, looked up and read through its versioned path.
    key = "http://example.test/packed"
    path = h.Control(sock).ok("store", key=key, response="{}")["path"]
    with open(path, "wb") as w:
        w.write(b"p" * 900)
    # Until the write queue writes the fill, the lookup answers the queued version ("@q<n>");
    # wait for the written one.
    got = h.wait_for(lambda: (lambda r: r if r.get("cached") and "@q" not in r.get("path", "") else None)(
        h.Control(sock).ok("lookup", key=key)), timeout=10)
    t.check(got and "body_path" not in got and "@p" in got.get("path", "") and
            base64.b64decode(got.get("body_base64", "")) == b"p" * 900,
            "a packed object's lookup names no body file but carries the bytes, and a packed version",
            str(got))
    t.check(got and h.read_bytes(got["path"]) == b"p" * 900, "its versioned path reads the packed bytes")
    fs.stop()

    r = rows(cache)
    small_key = [k for k in r if k.endswith("small.bin")]
    large_key = [k for k in r if k.endswith("large.bin")]
    t.check(small_key and r[small_key[0]] == (700, small) and
            not os.path.exists(body_file(cache, small_key[0])),
            "a 700-byte body is packed in its row, with no file", str(r.keys()))
    t.check(large_key and r[large_key[0]][1] is None and
            h.read_bytes(body_file(cache, large_key[0])) == large,
            "a 100 kB body stays a file of its own")
    t.check(r.get(key, (0, None))[1] == b"p" * 900, "the stored object is packed too")

    t.check(fs.start(), "mounts again", fs.output())
    t.check(h.read_bytes(os.path.join(mnt, "www", "small.bin")) == small and
            h.read_bytes(os.path.join(mnt, "www", "large.bin")) == large,
            "after a clean remount both read the origin's bytes")
    got = h.Control(sock).ok("lookup", key=key)
    t.check(got.get("cached") and h.read_bytes(got["path"]) == b"p" * 900,
            "the stored packed object reads back after the remount", str(got))
    fs.kill9()
    t.check(fs.start(), "mounts after a SIGKILL", fs.output())
    t.check(h.read_bytes(os.path.join(mnt, "www", "small.bin")) == small and
            h.read_bytes(os.path.join(mnt, "www", "large.bin")) == large,
            "after the crash both read the origin's bytes")
    t.check(os.stat(os.path.join(mnt, "www", "small.bin")).st_size == 700, "the packed one's size")
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
