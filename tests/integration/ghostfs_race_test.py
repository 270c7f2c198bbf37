#!/usr/bin/env python3
"""Replacement under concurrent readers: an origin object changes between
versions of distinct, recognisable content and size while one client refetches it through
ghostproxy with `Cache-Control: no-cache` in a loop (each refetch replaces the cached body) and
several readers read it through the proxy (one proxy with its RAM copies, one with
--memory-cache 0, so every hit reads the body from the shared cache) and through the ghostfs
mount (max-age=1, so the mount revalidates and replaces it too). Every body read must be
exactly one complete version: its SHA-256 is in the set of known versions, and a proxy
response's length is its Content-Length.

    ghostfs_race_test.py [SECONDS]   (default 15, or $GHOST_RACE_SECONDS; the acceptance run
                                      is 60)
TAP; skipped without root, /dev/fuse or nginx."""
import hashlib
import http.client
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 7
VERSIONS = 12


def version_body(i):
    """Version i: its own size (some bigger, some smaller than the others) and a fill that
    names it, so a mix of two versions is recognisable by eye too."""
    size = 150_000 + ((i * 7919) % VERSIONS) * 23_456
    unit = f"<version {i:02d}>".encode() + bytes(range(i, i + 20))
    return (unit * (size // len(unit) + 1))[:size]


def proxy_get(port, url, no_cache=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        headers = {"Cache-Control": "no-cache"} if no_cache else {}
        c.request("GET", url, headers=headers)
        r = c.getresponse()
        body = r.read()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), body
    finally:
        c.close()


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else float(os.environ.get("GHOST_RACE_SECONDS", "15"))
    h.require_root_and_fuse()
    work = h.tempdir()
    site = os.path.join(work, "site")
    os.makedirs(site)
    bodies = [version_body(i) for i in range(VERSIONS)]
    known = {hashlib.sha256(b).hexdigest(): i for i, b in enumerate(bodies)}
    obj = os.path.join(site, "obj.bin")

    def publish(i):
        tmp = obj + ".tmp"
        with open(tmp, "wb") as f:
            f.write(bodies[i])
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))  # a new ETag/Last-Modified each time
        os.rename(tmp, obj)

    publish(0)
    nginx = h.started_nginx(site, 'add_header Cache-Control "max-age=1";')
    t = h.Tap(PLAN)
    fs, mnt, ctl = h.mount_origin(t, PLAN, work, nginx.url(), check="ghostfs mounts")
    exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
    ports = []
    for extra in ([], ["--memory-cache", "0"]):
        port = h.free_port()
        p = subprocess.Popen([exe, "--listen", f"127.0.0.1:{port}", "--mount", mnt, "--control", ctl] + extra,
                             stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, f"proxy-{port}.log"), "w"))
        h.on_exit(lambda p=p: p.poll() is None and p.terminate())
        ports.append(port)
    if not t.check(all(h.wait_port(p, 15) for p in ports), "two ghostproxy instances start on the mount"):
        t.skip_rest(PLAN - 2, "no proxy")
        t.done()
    url = nginx.url() + "obj.bin"
    path = os.path.join(mnt, "www", "obj.bin")
    s, _, b = proxy_get(ports[0], url)
    t.check(s == 200 and b == bodies[0], "the first version reads through the proxy", s)

    stop = threading.Event()
    lock = threading.Lock()
    stats = {"proxy_reads": 0, "proxy_hits": 0, "mount_reads": 0, "refetches": 0, "replaced": 0,
             "bad": [], "errors": []}

    def bad(where, detail):
        with lock:
            if len(stats["bad"]) < 20:
                stats["bad"].append((where, detail))
            else:
                stats["bad"].append(None)

    def refetcher():
        i = 0
        while not stop.is_set():
            i = (i + 1) % VERSIONS
            publish(i)
            try:
                s, hd, b = proxy_get(ports[i % 2], url, no_cache=True)
                with lock:
                    stats["refetches"] += 1
                if s == 200 and hashlib.sha256(b).hexdigest() != hashlib.sha256(bodies[i]).hexdigest():
                    if hashlib.sha256(b).hexdigest() not in known:
                        bad("refetch", (len(b), hd.get("content-length")))
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    stats["errors"].append(f"refetch: {e}")
            time.sleep(0.02)

    def proxy_reader(port):
        while not stop.is_set():
            try:
                s, hd, b = proxy_get(port, url)
            except http.client.IncompleteRead as e:  # cut before its Content-Length: short
                bad(f"proxy {port}", ("short", len(e.partial), e.partial[:12]))
                continue
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    stats["errors"].append(f"proxy {port}: {e}")
                continue
            with lock:
                stats["proxy_reads"] += 1
                if hd.get("x-ghost-source") == "cache":
                    stats["proxy_hits"] += 1
            digest = hashlib.sha256(b).hexdigest()
            if s != 200 or digest not in known or str(len(b)) != hd.get("content-length"):
                bad(f"proxy {port}", (s, len(b), hd.get("content-length"), hd.get("x-ghost-source"), b[:12]))

    def mount_reader():
        while not stop.is_set():
            try:
                with open(path, "rb") as f:
                    b = f.read()
            except OSError as e:
                with lock:
                    stats["errors"].append(f"mount: {e}")
                time.sleep(0.01)
                continue
            with lock:
                stats["mount_reads"] += 1
            if hashlib.sha256(b).hexdigest() not in known:
                bad("mount", (len(b), b[:12]))

    threads = [threading.Thread(target=refetcher)]
    threads += [threading.Thread(target=proxy_reader, args=(ports[k % 2],)) for k in range(4)]
    threads += [threading.Thread(target=mount_reader) for _ in range(3)]
    for th in threads:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in threads:
        th.join(60)
    n_bad = len(stats["bad"])
    print(f"# {seconds:.0f} s: {stats['refetches']} refetches, {stats['proxy_reads']} proxy reads "
          f"({stats['proxy_hits']} cache hits), {stats['mount_reads']} mount reads, {n_bad} mixed or short, "
          f"{len(stats['errors'])} errors", flush=True)
    t.check(stats["refetches"] >= seconds * 2, "the object was replaced over and over", stats["refetches"])
    t.check(stats["proxy_hits"] >= seconds * 10 and stats["mount_reads"] >= seconds * 5,
            "readers read it concurrently through the proxy (cache hits) and the mount",
            (stats["proxy_hits"], stats["mount_reads"]))
    logs = []
    if n_bad:
        for port in ports:
            with open(os.path.join(work, f"proxy-{port}.log")) as f:
                logs += [f"{port}: {line}" for line in f.read().splitlines() if "keeps changing" not in line][-5:]
    t.check(n_bad == 0, "every body read is exactly one complete version (0 mixed or short)",
            ([x for x in stats["bad"] if x][:5], logs))
    t.check(len(stats["errors"]) == 0, "no read failed",
            (stats["errors"][:5], fs.output().splitlines()[-5:] if stats["errors"] else ""))
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
