#!/usr/bin/env python3
"""The dashboard and the energy saved:
  - ghostproxy --dashboard serves /ghost/ and a server-sent event stream /ghost/events that
    starts with a snapshot;
  - the proxy's /ghost/metrics gains device-mode, energy and saving gauges;
  - `ghostctl stats` says "saved X J (Y%) ... against a static cache" under --profile;
  - in headless Chromium the page shows the devices, and a mode change the daemon pushes (the
    emulated disk spinning up for a read) appears in the DOM within a second; a screenshot is
    kept in the build directory (ghostproxy_dashboard.png).
TAP; skipped without root, /dev/fuse, nginx, chromium or python3-websocket."""
import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 9
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-default-apps", "--disable-sync", "--no-first-run",
                  "--disable-features=Translate,OptimizationHints,MediaRouter,"
                  "NetworkTimeServiceQuerying,AutofillServerCommunication",
                  "--window-size=1200,900"]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Cdp:
    """The Chromium DevTools protocol over the page's WebSocket."""

    def __init__(self, ws_url):
        import websocket
        self.ws = websocket.create_connection(ws_url, timeout=20)
        self.n = 0

    def call(self, method, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            m = json.loads(self.ws.recv())
            if m.get("id") == self.n:
                return m.get("result", {})

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        return r.get("result", {}).get("value")


def main():
    work, root, sums, nginx = h.serve_tree()
    chromium = shutil.which("chromium")
    try:
        import websocket  # noqa: F401
    except ImportError:
        # Debian's python3-websocket, when the python3 running this is not Debian's.
        sys.path.append("/usr/lib/python3/dist-packages")
        try:
            import websocket  # noqa: F401
        except ImportError:
            websocket = None
    t = h.Tap(PLAN)
    fs, mnt, control = h.mount_origin(t, PLAN, work, nginx.url(),
                                      args=["--profile", "ipaq-2004", "--policy", "static"],
                                      check="mounts with --profile ipaq-2004")
    port, dport = h.free_port(), h.free_port()
    plog = open(os.path.join(work, "proxy.log"), "w")
    proxy = subprocess.Popen([os.path.join(h.build_dir(), "proxy", "ghostproxy"), "--mount", mnt,
                              "--control", control, "--listen", f"127.0.0.1:{port}",
                              "--dashboard", f"127.0.0.1:{dport}"], stdout=plog, stderr=subprocess.STDOUT)
    h.on_exit(lambda: (proxy.poll() is None and proxy.terminate()))
    if not t.check(h.wait_port(dport, 10) and h.wait_port(port, 10), "ghostproxy serves the dashboard",
                   open(plog.name).read()):
        t.skip_rest(PLAN - 2, "no dashboard")
        t.done()
    for _ in range(2):  # a fetch, then a read of the cached copy from the emulated disk
        with open(os.path.join(mnt, "www", "small.txt"), "rb") as f:
            f.read()
    page = get(f"http://127.0.0.1:{dport}/ghost/")
    state = json.loads(get(f"http://127.0.0.1:{dport}/ghost/state"))
    t.check("EventSource(\"/ghost/events\")" in page and state.get("devices") and
            "saved" in state.get("stats", {}),
            "/ghost/ is the page and the state holds the devices and the saving", json.dumps(state)[:500])
    # The proxy's own port leads to the dashboard: /ghost/ there redirects to the page.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/ghost/")
    r = conn.getresponse()
    r.read()
    conn.close()
    t.check(r.status == 302 and r.getheader("Location") == f"http://127.0.0.1:{dport}/ghost/",
            "the proxy port's /ghost/ leads to the dashboard", f"{r.status} {r.getheader('Location')}")
    metrics = get(f"http://127.0.0.1:{port}/ghost/metrics")
    t.check('ghost_device_mode{device="microdrive-1gb"' in metrics and "ghost_energy_joules{device=\"total\"}" in metrics
            and "ghost_energy_saved_joules" in metrics and 'ghost_energy_modelled{profile="ipaq-2004"} 1' in metrics,
            "the proxy's /ghost/metrics has device-mode, energy and saving gauges", metrics[-1500:])
    ctl = subprocess.run([os.path.join(h.build_dir(), "fs", "ghostctl"), "--control", control, "stats"],
                         capture_output=True, text=True, timeout=30).stdout
    t.check("against a static cache" in ctl and ("saved " in ctl or "spent an extra" in ctl) and " J (" in ctl,
            "ghostctl stats says what was saved against a static cache", ctl)

    if not chromium or websocket is None:
        t.skip_rest(PLAN, "chromium or python3-websocket missing")
        t.done()
    cport = h.free_port()
    profile = h.tempdir("ghost-chromium-")
    browser = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                f"--remote-debugging-port={cport}", f"http://127.0.0.1:{dport}/ghost/"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    h.on_exit(lambda: (browser.poll() is None and browser.kill()))
    targets = h.wait_for(lambda: [x for x in json.loads(get(f"http://127.0.0.1:{cport}/json"))
                                  if x.get("type") == "page" and "/ghost/" in x.get("url", "")], timeout=30)
    if not targets:
        t.skip_rest(PLAN, "chromium did not start")
        t.done()
    cdp = Cdp(targets[0]["webSocketDebuggerUrl"])
    row = 'document.querySelector(\'tr[data-device="microdrive-1gb"] td.mode\')'
    live = h.wait_for(lambda: cdp.eval(f'document.getElementById("conn").textContent === "live" && !!{row}'),
                      timeout=15)
    t.check(live, "in Chromium the page connects to the event stream and shows the disk",
            cdp.eval("document.body.innerText"))
    # Record every change of the disk's mode cell with the page's clock (ms since the epoch).
    cdp.eval("window.__seen = []; new MutationObserver(() => { const c = " + row +
             "; if (c) window.__seen.push([Date.now(), c.textContent]); })"
             ".observe(document.getElementById('devices'), {subtree: true, childList: true, characterData: true}); 1")
    # The daemon's pushes, seen from here: the disk spins up for a read of a cached file.
    sub = h.Control(control)
    sub.ok("subscribe", topics=["modes"])
    before = cdp.eval(f"{row}.textContent")
    with open(os.path.join(mnt, "www", "dir1", "a.txt"), "rb") as f:  # fetched: now cached
        f.read()
    time.sleep(1.0)  # the default policy lets the disk go to low-power idle after 0.5 s
    cdp.eval("window.__seen = []; 1")
    sub.f.readline  # (events queue up on the socket until read)
    pushed_at, pushed_mode = None, None
    sub.sock.settimeout(5)
    t0 = time.time()
    with open(os.path.join(mnt, "www", "dir1", "a.txt"), "rb") as f:  # from the disk: spins it up
        f.read()
    deadline = time.time() + 5
    while time.time() < deadline and pushed_at is None:
        try:
            ev = json.loads(sub.f.readline())
        except (OSError, ValueError):
            break
        if ev.get("event") != "modes" or ev.get("data", None) is None or ev.get("data") == []:
            continue
        data = ev["data"]
        disk = [d for d in (data if isinstance(data, list) else [data]) if d.get("name", d.get("device")) == "microdrive-1gb"]
        if disk and disk[0].get("mode") and disk[0]["mode"] != before and time.time() >= t0:
            pushed_at, pushed_mode = time.time(), disk[0]["mode"]
    time.sleep(1.2)
    seen = cdp.eval("window.__seen") or []
    shown = [ms / 1000 for ms, mode in seen if mode == pushed_mode and ms / 1000 >= t0 - 0.05]
    t.check(pushed_at is not None and shown and shown[0] - pushed_at < 1.0,
            "a disk mode change the daemon pushes appears in the page's DOM within a second",
            (before, pushed_mode, pushed_at, seen[:10]))
    shot = cdp.call("Page.captureScreenshot", format="png").get("data", "")
    out = os.path.join(h.build_dir(), "ghostproxy_dashboard.png")
    png = base64.b64decode(shot) if shot else b""
    with open(out, "wb") as f:
        f.write(png)
    t.check(png.startswith(b"\x89PNG") and len(png) > 5000, f"a screenshot of the dashboard is in {out}", len(png))
    sub.close()
    browser.kill()
    proxy.terminate()
    proxy.wait(10)
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
