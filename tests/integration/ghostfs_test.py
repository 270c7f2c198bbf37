#!/usr/bin/env python3
"""ghostfs against a real nginx on loopback: contents, listings, freshness and revalidation,
offline behaviour, the cache cap, extended attributes, local/ and durability across kill -9.
TAP output; skipped (not passed) without root, /dev/fuse or nginx."""
import errno
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 26


def main():
    work, root, sums, nginx = h.serve_tree()
    t = h.Tap(PLAN)
    fs, mnt, _ = h.mount_origin(t, PLAN, work, nginx.url(), check="mounts", control=False)
    www = os.path.join(mnt, "www")

    t.check(sorted(os.listdir(mnt)) == ["local", "www"], "the root lists the origin and local/", os.listdir(mnt))
    want = sorted(os.listdir(root))
    got = sorted(os.listdir(www))
    t.check(got == want, "an origin directory lists like the origin's autoindex", f"{got} vs {want}")
    t.check(sorted(os.listdir(os.path.join(www, "dir1"))) == ["a.txt", "b.bin", "sub"], "nested listings",
            os.listdir(os.path.join(www, "dir1")))

    mtimes_before = {rel: os.stat(os.path.join(www, rel)).st_mtime for rel in sums}
    bad = [rel for rel, s in sums.items() if h.sha256_file(os.path.join(www, rel)) != s]
    t.check(not bad, "every file reads byte-identical to the origin (small, large, nested, odd names)", bad)
    sizes = [rel for rel in sums if os.stat(os.path.join(www, rel)).st_size != os.path.getsize(os.path.join(root, rel))]
    t.check(not sizes, "stat sizes match the origin", sizes)

    # The fill is deferred to the write queue; with no profile the disk is always ready, so
    # it lands at once. Give the loop a moment, then the copy is cached.
    time.sleep(0.5)
    cached = os.getxattr(os.path.join(www, "page.html"), "user.ghost.cached").decode()
    t.check(cached == "1", "a read object is cached (user.ghost.cached)", cached)
    time.sleep(1.1)  # past the attribute timeout: stat asks the daemon again
    moved = {rel: (m, os.stat(os.path.join(www, rel)).st_mtime) for rel, m in mtimes_before.items()
             if os.stat(os.path.join(www, rel)).st_mtime != m or m == 0}
    t.check(not moved, "mtimes are non-zero and the same before and after caching", moved)
    etag = os.getxattr(os.path.join(www, "page.html"), "user.http.etag").decode()
    ctype = os.getxattr(os.path.join(www, "page.html"), "user.http.content_type").decode()
    t.check(etag.startswith('"') and ctype.startswith("text/html"), "user.http.etag and user.http.content_type",
            f"{etag!r} {ctype!r}")
    names = os.listxattr(os.path.join(www, "page.html"))
    t.check("user.ghost.source" in names and "user.ghost.cached" in names, "listxattr names the ghost attributes", names)

    # Second read: nginx's copy is heuristically stale at once (just written), so ghostfs
    # revalidates: the log shows a 304 and the bytes still match.
    before = len(nginx.log_lines())
    ok = h.sha256_file(os.path.join(www, "small.txt")) == sums["small.txt"]
    time.sleep(0.2)
    new = nginx.log_lines()[before:]
    t.check(ok and any('" 304 ' in l for l in new), "a stale copy is revalidated with a 304", new)
    src = os.getxattr(os.path.join(www, "small.txt"), "user.ghost.source").decode()
    t.check(src in ("revalidated", "disk"), "after a 304 the copy is read from the cache", src)

    # A changed origin file is seen once its freshness has expired.
    time.sleep(1.2)  # past the kernel's attribute timeout
    with open(os.path.join(root, "dir1", "a.txt"), "wb") as f:
        f.write(b"changed on the origin\n")
    time.sleep(1.2)
    with open(os.path.join(www, "dir1", "a.txt"), "rb") as f:
        data = f.read()
    t.check(data == b"changed on the origin\n", "a changed origin file is read after expiry", data[:40])

    # Read-only origin tree.
    try:
        open(os.path.join(www, "new.txt"), "w")
        t.check(False, "creating a file in an origin tree fails with EROFS")
    except OSError as e:
        t.check(e.errno == errno.EROFS, "creating a file in an origin tree fails with EROFS", e)

    # local/ behaves like a directory.
    local = os.path.join(mnt, "local")
    p = os.path.join(local, "notes.txt")
    with open(p, "w") as f:
        f.write("hello\n")
    with open(p, "a") as f:
        f.write("world\n")
    with open(p) as f:
        t.check(f.read() == "hello\nworld\n", "local/: create, write, append, read back")
    os.mkdir(os.path.join(local, "d"))
    os.rename(p, os.path.join(local, "d", "moved.txt"))
    t.check(os.listdir(os.path.join(local, "d")) == ["moved.txt"] and not os.path.exists(p), "local/: mkdir and rename")
    os.truncate(os.path.join(local, "d", "moved.txt"), 3)
    with open(os.path.join(local, "d", "moved.txt")) as f:
        t.check(f.read() == "hel", "local/: truncate")
    os.unlink(os.path.join(local, "d", "moved.txt"))
    os.rmdir(os.path.join(local, "d"))
    t.check(os.listdir(local) == [], "local/: unlink and rmdir", os.listdir(local))

    # fsync'd data survives kill -9 and a remount.
    durable = os.path.join(local, "durable.bin")
    payload = os.urandom(200_000)
    fd = os.open(durable, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, payload)
    os.fsync(fd)
    os.close(fd)
    fs.kill9()
    fs = fs.again()
    t.check(fs.start(), "remounts after kill -9", fs.output())
    with open(os.path.join(mnt, "local", "durable.bin"), "rb") as f:
        t.check(f.read() == payload, "fsync'd data survives kill -9 and a remount")

    # Offline: stop the origin.
    nginx.stop()
    ok = h.sha256_file(os.path.join(www, "large.bin")) == sums["large.bin"]
    t.check(ok, "offline: a cached object is served (stale if need be)")
    start = time.time()
    err = None
    try:
        os.stat(os.path.join(www, "never-fetched.bin"))
    except OSError as e:
        err = e.errno
    t.check(err in (errno.ENOENT, errno.EIO, errno.ENOTCONN) and time.time() - start < 2.5,
            "offline: an unknown name fails quickly", f"errno {err} after {time.time() - start:.2f} s")
    t.check(sorted(os.listdir(www)) == want, "offline: listings come from the saved index")
    fs.stop()
    fs = fs.again()
    t.check(fs.start(), "mounts from its saved index while the origin is down", fs.output())
    ok = sorted(os.listdir(www)) == want and h.sha256_file(os.path.join(www, "medium.bin")) == sums["medium.bin"]
    t.check(ok, "offline after remount: listing and cached contents")
    t.check(fs.proc.poll() is None, "the daemon is still running")
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
