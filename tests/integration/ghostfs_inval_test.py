#!/usr/bin/env python3
"""Long entry/attribute timeouts for fresh cached files, with invalidation (fs/inval_notifier.h,
OriginTree::CachedTimeout): while a cached copy is fresh the kernel may keep its attributes for up
to a minute, so a replacement of the object must reach the kernel at once. Two files the origin
serves with `expires 1h` (one packed in the index, one a body file) are read until cached and
stat'ed (the kernel now holds their attributes); the shared store then replaces each with a body
of another size (the proxy's path: "store" on the control socket, the bytes through
.ghost/fill); once the replacement is committed, the very next stat shows the new size and a
read returns the new bytes, hot and with the page cache dropped. TAP; skipped without root,
/dev/fuse or nginx."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 6


def main():
    work, root, _sums, nginx = h.serve_tree(extra_location="location /fresh/ { expires 1h; }")
    os.makedirs(os.path.join(root, "fresh"))
    files = {"small.bin": os.urandom(5_000), "large.bin": os.urandom(40_000)}
    for name, data in files.items():
        with open(os.path.join(root, "fresh", name), "wb") as f:
            f.write(data)
    t = h.Tap(PLAN)
    fs, mnt, sock = h.mount_origin(t, PLAN, work, nginx.url(), check="mounts with a control socket")
    ctl = h.Control(sock)
    www = os.path.join(mnt, "www", "fresh")

    cached = {}
    for name, data in files.items():
        path = os.path.join(www, name)
        got = h.read_bytes(path)
        ok = h.wait_for(lambda: os.getxattr(path, "user.ghost.cached") == b"1", 15)
        cached[name] = ok and got == data and os.stat(path).st_size == len(data)
    t.check(all(cached.values()), "both fresh files read byte-identical and are cached", cached)

    head = json.dumps({"status": 200, "headers": [["Content-Type", "application/octet-stream"]]})
    new = {"small.bin": os.urandom(7_000), "large.bin": os.urandom(55_000)}
    committed = {}
    for name, data in new.items():
        path = os.path.join(www, name)
        os.stat(path)  # the kernel holds the old attributes (a fresh copy: a long timeout)
        key = nginx.url() + "fresh/" + name
        fill = ctl.ok("store", key=key, response=head, expires_unix=int(time.time()) + 3600)["path"]
        with open(fill, "wb") as w:
            w.write(data)
        committed[name] = h.wait_for(
            lambda: ctl.ok("lookup", key=key).get("version", "q")[:1] in ("d", "p")
            and ctl.ok("lookup", key=key).get("size") == len(data), 10, 0.01)
    t.check(all(committed.values()), "the store commits both replacements", committed)

    sizes = {name: os.stat(os.path.join(www, name)).st_size for name in new}
    t.check(sizes == {name: len(data) for name, data in new.items()},
            "the first stat after each commit shows the new size (the kernel's long-lived attributes "
            "were invalidated)", sizes)
    hot = {name: h.read_bytes(os.path.join(www, name)) == data for name, data in new.items()}
    t.check(all(hot.values()), "reads return the new bytes", hot)
    h.drop_caches()
    cold = {name: h.read_bytes(os.path.join(www, name)) == data for name, data in new.items()}
    t.check(all(cold.values()), "and again with the page cache dropped", cold)
    ctl.close()
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
