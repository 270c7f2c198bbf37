#!/usr/bin/env python3
"""A new user's path, end to end (TAP):
  - `meson install` of this build into a DESTDIR (no second build);
  - an fstab line (mount -T FSTAB, type fuse, the installed ghostfs by path) mounts a site laid
    out like a real one (an index.html at the root, pages, images, a PDF) from nginx on
    loopback, with the paper's profile and a log file;
  - the site reads through the mount, the root's page included (index.html);
  - the origin stops: a read of a page not cached fails and the log file has a clear line
    saying the origin is down;
  - the installed ghostproxy's dashboard, in headless Chromium, shows the energy saved
    against a static cache.
Needs root and /dev/fuse (else skip), nginx (else skip); the Chromium check skips without
chromium."""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 6


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def make_site(root):
    """index.html at the root linking its pages, images and a manual, as sites are laid out."""
    rng = random.Random(7)
    os.makedirs(os.path.join(root, "img"))
    os.makedirs(os.path.join(root, "docs"))
    files = {
        "index.html": b"<html><body><h1>Home</h1><a href='about.html'>about</a> "
                      b"<img src='img/logo.png'> <a href='docs/manual.pdf'>manual</a></body></html>\n",
        "about.html": b"<html><body>About us</body></html>\n",
        "news.html": b"<html><body>News</body></html>\n",
        "img/logo.png": rng.randbytes(30_000),
        "docs/manual.pdf": rng.randbytes(300_000),
    }
    for name, data in files.items():
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def main():
    h.require_root_and_fuse()
    build = os.path.abspath(h.build_dir())
    t = h.Tap(PLAN)
    work = h.tempdir("ghost-acceptance-")
    dest = os.path.join(work, "root")
    inst = run(["meson", "install", "-C", build, "--no-rebuild", "--quiet", "--destdir", dest])
    bindir = None
    for dirpath, _, names in os.walk(dest):
        if "ghostfs" in names and "ghostproxy" in names:
            bindir = dirpath
            break
    if not t.check(inst.returncode == 0 and bindir is not None, "meson install into a DESTDIR",
                   inst.stdout + inst.stderr):
        t.skip_rest(PLAN, "nothing installed")
        t.done()
    site = os.path.join(work, "site")
    sums = make_site(site)
    nginx = h.Nginx(site)
    if not nginx.start():
        t.skip_rest(PLAN, "nginx is not installed or did not start")
        t.done()

    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    log = os.path.join(work, "ghostfs.log")
    ctl = os.path.join(work, "control.sock")
    fstab = os.path.join(work, "fstab")
    with open(fstab, "w") as f:
        f.write(f"{bindir}/ghostfs#ghost {mnt} fuse cache={work}/cache,origin=www={nginx.url()},"
                f"profile=ipaq-2004,knob=50,control={ctl},log_file={log},noauto 0 0\n")
    h.on_exit(lambda: subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL))
    env = {k: v for k, v in os.environ.items() if k != "GHOST_PROFILE_DIR"}
    m = run(["mount", "-T", fstab, mnt], env=env)
    read_ok, detail = False, m.stdout + m.stderr
    if m.returncode == 0 and h.wait_for(lambda: os.path.ismount(mnt), timeout=10):
        try:
            got = {n: h.sha256_file(os.path.join(mnt, "www", n))
                   for n in ("index.html", "img/logo.png", "docs/manual.pdf", "about.html")}
            read_ok = all(got[n] == sums[n] for n in got)
            detail += repr(got)
        except OSError as e:
            detail += str(e)
    t.check(read_ok, "an fstab line mounts the site and its pages read through the mount, index.html included",
            detail)

    nginx.stop()
    try:
        with open(os.path.join(mnt, "www", "news.html"), "rb") as f:
            f.read()
        failed = None
    except OSError as e:
        failed = e
    t.check(failed is not None, "with the origin stopped, a page never read fails", repr(failed))

    def down_line():
        try:
            with open(log) as f:
                return [ln for ln in f if "origin www" in ln and "down" in ln]
        except OSError:
            return []
    t.check(h.wait_for(lambda: down_line(), timeout=10), "the log file says the origin is down",
            "".join(down_line()) or (open(log).read()[-2000:] if os.path.exists(log) else "no log file"))

    dport, pport = h.free_port(), h.free_port()
    plog = open(os.path.join(work, "ghostproxy.log"), "w")
    proxy = subprocess.Popen([os.path.join(bindir, "ghostproxy"), "--mount", mnt, "--control", ctl,
                              "--listen", f"127.0.0.1:{pport}", "--dashboard", f"127.0.0.1:{dport}"],
                             stdout=plog, stderr=subprocess.STDOUT, env=env)
    h.on_exit(lambda: proxy.poll() is None and proxy.kill())
    state = ""
    if h.wait_port(dport, 10):
        with urllib.request.urlopen(f"http://127.0.0.1:{dport}/ghost/state", timeout=5) as r:
            state = r.read().decode()
    t.check('"saved"' in state and '"energy_j"' in state, "the installed ghostproxy's dashboard has the saving",
            state[:500] or open(plog.name).read())

    chromium = shutil.which("chromium")
    try:
        try:
            import websocket  # noqa: F401
        except ImportError:  # Debian's python3-websocket, when this python3 is not Debian's
            sys.path.append("/usr/lib/python3/dist-packages")
            import websocket  # noqa: F401
        from ghostproxy_dashboard_test import CHROMIUM_FLAGS, Cdp
    except ImportError:
        chromium = None
    if not chromium:
        t.skip_rest(PLAN, "chromium or python3-websocket is not installed")
    else:
        # The user opens the proxy's address: /ghost/ there leads to the dashboard's page.
        cport = h.free_port()
        profile = h.tempdir("ghost-chromium-")
        browser = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                    f"--remote-debugging-port={cport}", f"http://127.0.0.1:{pport}/ghost/"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        h.on_exit(lambda: (browser.poll() is None and browser.kill()))

        def pages():
            with urllib.request.urlopen(f"http://127.0.0.1:{cport}/json", timeout=5) as r:
                return [x for x in json.loads(r.read()) if x.get("type") == "page" and "/ghost/" in x.get("url", "")]
        targets = h.wait_for(lambda: pages() if h.wait_port(cport, 0.2) else [], timeout=30)
        line = ""
        if targets:
            cdp = Cdp(targets[0]["webSocketDebuggerUrl"])
            text = 'document.getElementById("saved").textContent'
            h.wait_for(lambda: "against a static cache" in (cdp.eval(text) or ""), timeout=15)
            line = cdp.eval(text) or ""
        t.check(("saved " in line or "spent an extra" in line) and " J (" in line and "against a static cache" in line,
                "in Chromium the dashboard, opened at the proxy's address, shows the energy saved", line)
        browser.kill()
    proxy.terminate()
    proxy.wait(10)
    run(["umount", mnt])
    t.done()


if __name__ == "__main__":
    main()
