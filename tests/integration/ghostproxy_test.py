#!/usr/bin/env python3
"""ghostproxy end to end: real clients (curl, wget, headless Chromium) through the proxy, its
cache in a real ghostfs mount (GhostfsBackend), against nginx on 127.0.0.1
(DESIGN §4.3): MISS then HIT; revalidation after expiry (304 in nginx's log); Vary variants
stored separately; one cache with the mount (an object read through the mount is a proxy
hit); a page with HTML, CSS, JS and an image loaded twice by Chromium with fresh profiles,
the second time from the cache with the same DOM; hits from the proxy's RAM copy
(MEM_HIT: byte-identical, counted by ghostfs, dropped when ghostfs invalidates the object or the
origin's new version replaces it; --memory-cache 0 keeps none); CONNECT to an allowed port tunnels both
ways, to another port is refused; the status and metrics pages. TAP; skipped without root,
/dev/fuse or nginx; the Chromium checks are skipped without chromium."""
import gzip
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 22

NGINX_EXTRA = """
    types { text/html html; text/css css; application/javascript js; image/png png;
            text/plain txt; application/octet-stream bin; }
    expires 1h;
    gzip on; gzip_vary on; gzip_proxied any; gzip_min_length 0; gzip_types text/plain text/css application/javascript;
    location /short/ { expires 1s; }
    location /three/ { expires 3s; }
"""


def png(width, height, rgb):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def make_site(root):
    os.makedirs(os.path.join(root, "page"))
    os.makedirs(os.path.join(root, "short"))
    os.makedirs(os.path.join(root, "three"))
    files = {
        "page/home.html": b"""<!doctype html><html><head><title>ghost page</title>
<link rel="stylesheet" href="style.css"><script src="app.js"></script></head>
<body><h1 id="title">Ghost</h1><img id="logo" src="logo.png" width="8" height="8">
<p id="filled"></p></body></html>""",
        "page/style.css": b"h1 { color: rgb(10, 20, 30); } p { margin: 3px; }\n",
        "page/app.js": b"""document.addEventListener('DOMContentLoaded', () => {
  const css = getComputedStyle(document.getElementById('title')).color;
  const img = document.getElementById('logo');
  const done = () => { document.getElementById('filled').textContent =
      'script ran; title colour ' + css + '; image ' + img.naturalWidth + 'x' + img.naturalHeight; };
  if (img.complete) done(); else { img.onload = done; img.onerror = done; }
});
""",
        "page/logo.png": png(8, 8, (200, 30, 30)),
        "short/note.txt": b"short-lived\n",
        "text.txt": b"compressible text " * 400,
        "shared.bin": os.urandom(50_000),
        "mem.bin": os.urandom(20_000),
        "three/mem.txt": b"first version\n",
    }
    for rel, data in files.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return files


def curl(port, url, *args):
    r = subprocess.run(["curl", "-s", "-D", "-", "-o", "-", "-x", f"http://127.0.0.1:{port}", *args, url],
                       capture_output=True, timeout=30)
    head, _, body = r.stdout.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    return status, headers, body


def echo_server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                while True:
                    d = c.recv(65536)
                    if not d:
                        break
                    c.sendall(d[::-1])  # reversed, so an echo is not mistaken for a reflection

    threading.Thread(target=serve, daemon=True).start()
    h.on_exit(srv.close)
    return srv.getsockname()[1]


def connect_tunnel(port, target):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(4096)
        if not d:
            break
        head += d
    return s, head.decode("latin-1")


def chromium_dom(port, url, profile):
    exe = shutil.which("chromium")
    cmd = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
           "--disable-sync", "--no-first-run",
           "--disable-features=Translate,OptimizationHints,MediaRouter,NetworkTimeServiceQuerying,"
           "AutofillServerCommunication",
           f"--proxy-server=http://127.0.0.1:{port}", "--proxy-bypass-list=<-loopback>",
           f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.stdout


def access_lines(path, since=0):
    """The access log's lines from `since` on, once it has stopped growing for 0.1 s: the
    proxy's writer thread writes a line shortly after its client has the response
    (proxy/access_log.h)."""
    text, stable_since = None, time.monotonic()
    while True:
        with open(path) as f:
            now = f.read()
        if now != text:
            text, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= 0.1:
            return text.splitlines()[since:]
        time.sleep(0.02)


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    site = os.path.join(work, "site")
    files = make_site(site)
    nginx = h.started_nginx(site, NGINX_EXTRA)
    t = h.Tap(PLAN)
    fs, mnt, ctl = h.mount_origin(t, PLAN, work, nginx.url())
    echo_port = echo_server()
    port = h.free_port()
    log = os.path.join(work, "access.log")
    exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
    proxy = subprocess.Popen([exe, "--listen", f"127.0.0.1:{port}", "--mount", mnt, "--control", ctl,
                              "--access-log", log, "--connect-ports", str(echo_port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    h.on_exit(lambda: proxy.poll() is None and proxy.terminate())
    if not t.check(h.wait_port(port, 15), "ghostproxy starts on the ghostfs mount"):
        t.skip_rest(PLAN, "ghostproxy did not start")
        t.done()
    base = nginx.url()

    # curl: MISS, then HIT with the same bytes.
    s1, h1, b1 = curl(port, base + "shared.bin")
    time.sleep(0.3)
    s2, h2, b2 = curl(port, base + "shared.bin")
    t.check(s1 == 200 and h1.get("x-ghost-source") == "network" and s2 == 200 and h2.get("x-ghost-source") == "cache"
            and b1 == b2 == files["shared.bin"], "curl: the first GET goes to the network, the second is a cache hit",
            (h1.get("x-ghost-source"), h2.get("x-ghost-source")))
    lines = access_lines(log)
    t.check(len(lines) >= 2 and "MISS/200" in lines[-2] and "HIT/200" in lines[-1],
            "the access log records MISS then HIT", lines[-2:])
    t.check("via" in h1 and "x-ghost-source" in h2, "responses carry Via and X-Ghost-Source", h1)

    # wget through the proxy sees the same cached copy.
    r = subprocess.run(["wget", "-q", "-S", "-O", "-", "-e", "use_proxy=yes", "-e",
                        f"http_proxy=http://127.0.0.1:{port}", base + "shared.bin"],
                       capture_output=True, timeout=30)
    t.check(r.returncode == 0 and r.stdout == files["shared.bin"] and b"X-Ghost-Source: cache" in r.stderr,
            "wget through the proxy gets the cached copy", r.stderr.decode(errors="replace")[-400:])

    # RAM copies (proxy/memory_cache.h): once a hit has read the whole body, the next hits come
    # from the proxy's memory, byte-identical, and ghostfs counts them as memory reads.
    control = h.Control(ctl)
    time.sleep(0.3)  # reads from RAM are reported to ghostfs in batches: the earlier ones first
    stats0 = control.ok("stats")
    mark = len(access_lines(log))
    got = []
    for _ in range(4):
        got.append(curl(port, base + "mem.bin"))
        time.sleep(0.3)  # the first one's fill reaches the cache through the write queue
    codes = [l.split()[3] for l in access_lines(log, mark)]
    t.check(codes == ["MISS/200", "HIT/200", "MEM_HIT/200", "MEM_HIT/200"]
            and all(b == files["mem.bin"] and hd.get("x-ghost-source") in ("network", "cache") for _, hd, b in got)
            and got[3][1].get("content-length") == str(len(files["mem.bin"])),
            "after a hit has read the whole body, the next hits are served from RAM with the same bytes", codes)
    time.sleep(0.3)  # reads from RAM are reported to ghostfs in batches
    stats1 = control.ok("stats")
    t.check(stats1["proxy"]["memory_hits"] - stats0["proxy"]["memory_hits"] == 2
            and stats1["requests"]["memory"] - stats0["requests"]["memory"] >= 2,
            "ghostctl stats counts the hits served from RAM as memory reads",
            (stats0["proxy"], stats1["proxy"], stats0["requests"], stats1["requests"]))

    # Invalidated through ghostfs by another client: the RAM copy goes too; the next GET
    # fetches the origin's new bytes although the old copy was still fresh (expires 1h).
    new_bin = os.urandom(20_000)
    with open(os.path.join(site, "mem.bin"), "wb") as f:
        f.write(new_bin)
    removed = control.ok("invalidate", key=base + "mem.bin")
    time.sleep(0.2)
    mark = len(access_lines(log))
    s, hd, body = curl(port, base + "mem.bin")
    codes = [l.split()[3] for l in access_lines(log, mark)]
    t.check(removed.get("removed") and body == new_bin and codes == ["MISS/200"],
            "an object invalidated through ghostfs is not served from the proxy's RAM", (removed, codes))

    # Changed at the origin and revalidated after expiry: the new version replaces the RAM copy.
    curl(port, base + "three/mem.txt")
    time.sleep(0.2)
    curl(port, base + "three/mem.txt")
    mark = len(access_lines(log))
    s, hd, warm = curl(port, base + "three/mem.txt")
    warm_code = [l.split()[3] for l in access_lines(log, mark)]
    with open(os.path.join(site, "three", "mem.txt"), "wb") as f:
        f.write(b"second version, longer\n")
    time.sleep(3.5)  # expires 3s
    s, hd, fetched = curl(port, base + "three/mem.txt")
    time.sleep(0.3)
    s, hd, again = curl(port, base + "three/mem.txt")
    t.check(warm_code == ["MEM_HIT/200"] and warm == b"first version\n"
            and fetched == again == b"second version, longer\n",
            "a stale RAM copy is revalidated: the origin's new version is served, not the old copy",
            (warm_code, warm, fetched, again))

    # --memory-cache 0: no RAM copies; every hit asks ghostfs (HIT, never MEM_HIT).
    port0 = h.free_port()
    log0 = os.path.join(work, "access0.log")
    proxy0 = subprocess.Popen([exe, "--listen", f"127.0.0.1:{port0}", "--mount", mnt, "--control", ctl,
                               "--access-log", log0, "--memory-cache", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    h.on_exit(lambda: proxy0.poll() is None and proxy0.terminate())
    if h.wait_port(port0, 15):
        got0 = [curl(port0, base + "shared.bin") for _ in range(4)]
        codes0 = [l.split()[3] for l in access_lines(log0)]
        st0 = json.loads(subprocess.run(["curl", "-s", f"http://127.0.0.1:{port0}/ghost/status"],
                                        capture_output=True, text=True, timeout=10).stdout or "{}")
        t.check(codes0 == ["HIT/200"] * 4 and all(b == files["shared.bin"] for _, _, b in got0)
                and st0.get("requests", {}).get("MEM_HIT") == 0,
                "with --memory-cache 0 every hit is read through ghostfs, none from RAM", codes0)
    else:
        t.check(False, "with --memory-cache 0 every hit is read through ghostfs, none from RAM", "did not start")
    proxy0.terminate()
    proxy0.wait(15)
    bad = subprocess.run([exe, "--mount", mnt, "--control", ctl, "--memory-cache", "lots"],
                         capture_output=True, text=True, timeout=10)
    t.check(bad.returncode == 2 and "--memory-cache" in bad.stderr,
            "a bad --memory-cache is refused with a clear message", (bad.returncode, bad.stderr))
    control.close()

    # One cache with the mount: what ghostfs read through its origin is a proxy hit.
    with open(os.path.join(mnt, "www", "page", "style.css"), "rb") as f:
        mounted = f.read()
    time.sleep(0.3)
    s, hd, body = curl(port, base + "page/style.css", "-H", "Accept-Encoding: identity")
    t.check(mounted == files["page/style.css"] and hd.get("x-ghost-source") == "cache" and body == mounted,
            "an object read through the mount is served by the proxy from the same cache", hd)

    # Revalidation after expiry: nginx answers 304, the proxy says revalidated.
    curl(port, base + "short/note.txt")
    time.sleep(2.2)
    mark = len(nginx.log_lines())
    s, hd, body = curl(port, base + "short/note.txt")
    new = [l for l in nginx.log_lines()[mark:] if "note.txt" in l]
    t.check(s == 200 and hd.get("x-ghost-source") == "revalidated" and body == files["short/note.txt"]
            and any('" 304 ' in l for l in new),
            "after expiry the copy is revalidated (304 in nginx's log, X-Ghost-Source: revalidated)", (hd, new))

    # Vary: Accept-Encoding — gzip and identity variants are stored separately.
    sg, hg, bg = curl(port, base + "text.txt", "-H", "Accept-Encoding: gzip")
    si, hi, bi = curl(port, base + "text.txt", "-H", "Accept-Encoding: identity")
    time.sleep(0.3)
    sg2, hg2, bg2 = curl(port, base + "text.txt", "-H", "Accept-Encoding: gzip")
    si2, hi2, bi2 = curl(port, base + "text.txt", "-H", "Accept-Encoding: identity")
    ok = (hg.get("content-encoding") == "gzip" and gzip.decompress(bg) == files["text.txt"]
          and bi == files["text.txt"] and hi.get("x-ghost-source") == "network"
          and hg2.get("x-ghost-source") == "cache" and hi2.get("x-ghost-source") == "cache"
          and bg2 == bg and bi2 == bi and hg2.get("content-encoding") == "gzip" and "content-encoding" not in hi2)
    t.check(ok, "Vary: each Accept-Encoding variant is fetched once and served from its own entry",
            [(x.get("x-ghost-source"), x.get("content-encoding")) for x in (hg, hi, hg2, hi2)])

    # The proxy's index of the variants lives under the plain URL key; the mount must not
    # mistake it for the file.
    with open(os.path.join(mnt, "www", "text.txt"), "rb") as f:
        through_mount = f.read()
    t.check(through_mount == files["text.txt"], "after the proxy stored Vary variants, the mount still reads the file",
            len(through_mount))

    # CONNECT: an allowed port tunnels bytes both ways; another port is refused.
    s, head = connect_tunnel(port, f"127.0.0.1:{echo_port}")
    s.sendall(b"ping through the tunnel")
    got = b""
    while len(got) < len(b"ping through the tunnel"):
        d = s.recv(4096)
        if not d:
            break
        got += d
    s.close()
    t.check(head.startswith("HTTP/1.1 200") and got == b"ping through the tunnel"[::-1],
            "CONNECT to an allowed port tunnels bytes both ways", (head, got))
    s, head = connect_tunnel(port, f"127.0.0.1:{nginx.port}")
    s.close()
    t.check(head.startswith("HTTP/1.1 403") or head.startswith("HTTP/1.1 405"),
            "CONNECT to a port not on the allowlist is refused", head.splitlines()[:1])

    # The proxy's own pages.
    st = json.loads(subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/ghost/status"],
                                   capture_output=True, text=True, timeout=10).stdout or "{}")
    metrics = subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/ghost/metrics"],
                             capture_output=True, text=True, timeout=10).stdout
    t.check(isinstance(st, dict) and "connections" in st and "# TYPE" in metrics and "ghostproxy_" in metrics,
            "/ghost/status is JSON and /ghost/metrics is Prometheus text", (list(st)[:8], metrics[:200]))

    # Chromium, twice, fresh profiles: the second load comes from the cache, same DOM.
    if not shutil.which("chromium"):
        for name in ("Chromium loads the page through the proxy (HTML, CSS, JS, image)",
                     "the second load (fresh profile) is served entirely from the cache",
                     "the DOM is identical on both loads"):
            t.n += 1
            print(f"ok {t.n} - {name} # SKIP chromium is not installed", flush=True)
    else:
        page = base + "page/home.html"
        mark = len(access_lines(log))
        dom1 = chromium_dom(port, page, os.path.join(work, "profile-1"))
        first = access_lines(log, mark)
        mark = len(access_lines(log))
        dom2 = chromium_dom(port, page, os.path.join(work, "profile-2"))
        second = access_lines(log, mark)
        assets = ("home.html", "style.css", "app.js", "logo.png")
        t.check("script ran; title colour rgb(10, 20, 30); image 8x8" in dom1
                and all(any(a in l for l in first) for a in assets),
                "Chromium loads the page through the proxy (HTML, CSS, JS, image)", (dom1[-300:], first))
        page_lines = [l for l in second if any(a in l for a in assets)]
        t.check(len(page_lines) >= 4 and all("HIT/" in l for l in page_lines),
                "the second load (fresh profile) is served entirely from the cache", second)
        t.check(dom1 == dom2 and dom1 != "", "the DOM is identical on both loads", (dom1[-200:], dom2[-200:]))

    t.check(proxy.poll() is None and fs.proc.poll() is None, "proxy and daemon are still running")
    proxy.terminate()
    proxy.wait(15)
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
