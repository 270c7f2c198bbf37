#!/usr/bin/env python3
"""Failures are said, with the right errno:
  - --log-file gets one line per origin failure (URL, reason, errno) and per state change
    (origin down, up again), in the foreground and daemonised (lines written straight to
    stderr land there too);
  - a directory that answers 404 is ENOENT (not an empty listing), 403 is EACCES, a refused
    connection ECONNREFUSED, a host name that does not resolve EHOSTUNREACH;
  - `ghostctl stats` and `ghostctl status PATH` report each origin's health;
  - --log-level error keeps info lines out;
  - without --profile, stats say energy is not modelled (not "0 J"); with one, which profile.
TAP; skipped without root, /dev/fuse or nginx."""
import errno
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 15


def err_of(fn):
    try:
        fn()
        return 0
    except OSError as e:
        return e.errno


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def main():
    work, root, sums, nginx = h.serve_tree(extra_location="location /dir1/ { return 403; }")
    t = h.Tap(PLAN)
    closed = h.free_port()  # nothing listens here
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    log = os.path.join(work, "ghostfs.log")
    control = os.path.join(work, "ctl")
    fs = h.Ghostfs(mnt, os.path.join(work, "cache"),
                   {"www": nginx.url(), "gone": f"http://127.0.0.1:{closed}/",
                    "typo": "http://no-such-host.invalid/", "missing": nginx.url() + "no-such-dir/"},
                   args=["--log-file", log, "--stall-timeout", "3"], control=control)
    if not t.check(fs.start(), "mounts with --log-file", fs.output()):
        t.skip_rest(PLAN - 1, "not mounted")
        t.done()

    e = err_of(lambda: os.listdir(os.path.join(mnt, "missing")))
    t.check(e == errno.ENOENT, "a directory the origin answers 404 for is ENOENT, not an empty listing",
            (e, read(log)))
    e = err_of(lambda: os.listdir(os.path.join(mnt, "www", "dir1")))
    t.check(e == errno.EACCES, "a directory answering 403 is EACCES", e)
    e = err_of(lambda: os.listdir(os.path.join(mnt, "gone")))
    t.check(e == errno.ECONNREFUSED, "an origin refusing connections is ECONNREFUSED", e)
    e = err_of(lambda: os.listdir(os.path.join(mnt, "typo")))
    t.check(e == errno.EHOSTUNREACH, "a host name that does not resolve is EHOSTUNREACH", e)
    with open(os.path.join(mnt, "www", "small.txt"), "rb") as f:
        f.read()

    text = read(log)
    lines = text.splitlines()
    t.check(any("origin gone" in l and f"127.0.0.1:{closed}" in l and "ECONNREFUSED" in l for l in lines) and
            any("origin gone" in l and "down" in l and "error:" in l for l in lines) and
            any("origin typo" in l and "down" in l for l in lines),
            "the log file has each unreachable origin's failure (URL, reason, errno) and its going down",
            text)
    t.check(any("origin www" in l and "/dir1/" in l and "HTTP 403" in l and "EACCES" in l for l in lines) and
            any("origin missing" in l and "HTTP 404" in l and "ENOENT" in l for l in lines),
            "HTTP failures are logged with their URL, status and errno", text)

    st = h.ghostctl(control, "--json", "stats")
    stats = json.loads(st.stdout) if st.returncode == 0 else {}
    o = stats.get("origins", {})
    t.check(o.get("gone", {}).get("state") == "down" and o.get("www", {}).get("state") == "up" and
            o.get("gone", {}).get("last_failure", {}).get("errno") == "ECONNREFUSED",
            "stats report each origin's health", json.dumps(o)[:800])
    txt = h.ghostctl(control, "stats").stdout
    status = h.ghostctl(control, "status", os.path.join(mnt, "www", "small.txt")).stdout
    t.check("origin gone" in txt and "down" in txt and "origin" in status and "up for" in status,
            "ghostctl stats and status PATH show origin health", txt + status)
    t.check(stats.get("energy_model", {}).get("modelled") is False and "not modelled" in txt and
            "0.00 J total" not in txt,
            "without --profile, stats say energy is not modelled instead of 0 J", txt)

    # The origin comes up: the next fetch logs it.
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", closed))
    srv.listen(8)
    h.on_exit(srv.close)
    import threading

    def answer():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.recv(4096)
            body = b"<html><body><a href=\"x.txt\">x.txt</a></body></html>"
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: " +
                      str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            c.close()
    threading.Thread(target=answer, daemon=True).start()
    err_of(lambda: os.listdir(os.path.join(mnt, "gone")))
    ok = h.wait_for(lambda: "origin gone" in read(log) and "up again" in read(log), timeout=5)
    t.check(ok, "an origin answering again is logged as up again", read(log)[-600:])
    fs.stop()

    # Daemonised, --log-level error, a profile: only errors, and lines from the daemon child.
    log2 = os.path.join(work, "daemon.log")
    mnt2 = os.path.join(work, "mnt2")
    os.makedirs(mnt2)
    exe = os.path.join(h.build_dir(), "fs", "ghostfs")
    ctl2 = os.path.join(work, "ctl2")
    r = subprocess.run([exe, "--cache", os.path.join(work, "cache2"), "--origin", f"gone=http://127.0.0.1:{h.free_port()}/",
                        "--origin", "www=" + nginx.url(), "--profile", "ipaq-2004",
                        "--log-file", log2, "--log-level", "error", "--control", ctl2, mnt2],
                       capture_output=True, text=True, timeout=30)
    h.on_exit(lambda: subprocess.run(["fusermount3", "-u", mnt2], stderr=subprocess.DEVNULL))
    if not t.check(r.returncode == 0 and os.path.ismount(mnt2), "mounts daemonised", r.stderr):
        t.skip_rest(PLAN, "not mounted")
        t.done()
    err_of(lambda: os.listdir(os.path.join(mnt2, "gone")))
    h.wait_for(lambda: "down" in read(log2), timeout=5)
    text2 = read(log2)
    st2 = h.ghostctl(ctl2, "stats").stdout
    t.check("origin gone" in text2 and "down" in text2 and " info:" not in text2 and " warn:" not in text2,
            "a daemonised ghostfs logs to --log-file, at --log-level error only errors", text2)
    t.check("modelled from profile ipaq-2004" in st2, "with --profile, stats name the profile the energy is modelled from",
            st2)
    subprocess.run(["fusermount3", "-u", mnt2], stderr=subprocess.DEVNULL)

    # Daemonised without --log-file: syslog(3), read here from /dev/log (journald's socket on
    # a systemd machine) when no syslog daemon holds it.
    if os.path.exists("/dev/log"):
        t.skip_rest(PLAN, "/dev/log belongs to a running syslog; its lines cannot be read here")
        t.done()
    dev_log = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dev_log.bind("/dev/log")
    h.on_exit(lambda: os.path.exists("/dev/log") and os.unlink("/dev/log"))
    dev_log.settimeout(0.5)
    mnt3 = os.path.join(work, "mnt3")
    os.makedirs(mnt3)
    r = subprocess.run([exe, "--cache", os.path.join(work, "cache3"), "--origin", f"gone=http://127.0.0.1:{h.free_port()}/",
                        "--control", os.path.join(work, "ctl3"), mnt3], capture_output=True, text=True, timeout=30)
    h.on_exit(lambda: subprocess.run(["fusermount3", "-u", mnt3], stderr=subprocess.DEVNULL))
    err_of(lambda: os.listdir(os.path.join(mnt3, "gone")))
    got = []
    deadline = time.time() + 5
    while time.time() < deadline and not any("down" in g for g in got):
        try:
            got.append(dev_log.recv(65536).decode(errors="replace"))
        except socket.timeout:
            pass
    subprocess.run(["fusermount3", "-u", mnt3], stderr=subprocess.DEVNULL)
    dev_log.close()
    os.unlink("/dev/log")
    t.check(r.returncode == 0 and any("ghostfs[" in g and "origin gone" in g and "down" in g for g in got),
            "a daemonised ghostfs without --log-file logs to syslog (/dev/log)", (r.stderr, got[:5]))
    t.done()


if __name__ == "__main__":
    main()
