#!/usr/bin/env python3
"""ghostfs's command line and bad input. First the usage errors, which need no mount: --help,
bad origins, knob and profile, an uncreatable cache directory, config files with errors (exit 2,
one clear line naming the file and line). Then, mounted against nginx and a raw socket origin on
127.0.0.1: a cache directory under missing parents, a config file that mounts and serves,
`..` and '%2e%2e' that must not leave the origin, an origin that sends a truncated body, and a
directory URL that is not an HTML listing (the mount stays up throughout); one daemon per cache
directory (also daemonised) and no mount on top of a ghostfs or a dead FUSE mount.
TAP; the usage part needs only the built ghostfs, the mounted part skips without root,
/dev/fuse or nginx."""
import errno
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 28
OPTIONS = ["--cache", "--origin", "--profile", "--knob", "--control", "--config", "--cache-size",
           "--max-stale", "--no-passthrough", "-o"]
PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common", "profiles")


def exe():
    return os.path.join(h.build_dir(), "fs", "ghostfs")


def run(args, mnt, timeout=15):
    """Runs ghostfs -f ARGS MNT to completion; a run that mounts instead is unmounted and
    reported with returncode None."""
    cmd = [exe(), "-f", *args, mnt]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL)
        return None, e.stdout or "", e.stderr or ""


def one_clear_line(stderr, *words):
    """stderr is one line, "ghostfs: ...", containing every one of `words`."""
    lines = stderr.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("ghostfs: ") and all(w in lines[0] for w in words)


def no_crash(rc, stderr):
    return rc is not None and rc >= 0 and not any(
        s in stderr for s in ("terminate called", "Segmentation", "Aborted", "AddressSanitizer"))


class ArgvGhostfs(h.Ghostfs):
    """A ghostfs started with exactly `argv` (no --cache/--origin added), e.g. --config FILE."""

    def __init__(self, mnt, argv):
        super().__init__(mnt, None, {})
        self.argv = list(argv)

    def command(self):
        return [exe(), "-f", *self.argv, self.mnt]


# ---- a raw origin: an autoindex-like listing, a truncated body, a non-HTML "directory" ----

LISTING = b"""<html>
<head><title>Index of /</title></head>
<body>
<h1>Index of /</h1><hr><pre><a href="../">../</a>
<a href="broken.bin">broken.bin</a>                                         22-Nov-2026 19:58                1000
<a href="plain/">plain/</a>                                             22-Nov-2026 19:58                   -
</pre><hr></body>
</html>
"""
PLAIN = b"this is not a directory listing\nbroken.bin\nother.bin\n"


class RawOrigin:
    """An HTTP origin written on a bare socket, one request per connection:
    GET / (or HEAD): LISTING; /broken.bin: 200, Content-Length 1000, 10 bytes, close;
    /plain/: 200 text/plain; anything else 404. Records the request lines."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests = []
        self.stopping = False
        threading.Thread(target=self.serve, daemon=True).start()
        h.on_exit(self.stop)

    def url(self):
        return f"http://127.0.0.1:{self.port}/"

    def stop(self):
        self.stopping = True
        self.sock.close()

    def serve(self):
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn):
        with conn:
            conn.settimeout(5)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    data += chunk
            except OSError:
                return
            line = data.split(b"\r\n", 1)[0].decode("latin-1")
            self.requests.append(line)
            method, path = (line.split(" ") + ["", ""])[:2]
            head_only = method == "HEAD"
            if path == "/":
                reply = self.ok(LISTING, "text/html", head_only)
            elif path == "/broken.bin":
                reply = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + (b"" if head_only else b"0123456789")
            elif path == "/plain/":
                reply = self.ok(PLAIN, "text/plain", head_only)
            else:
                reply = self.ok(b"not found\n", "text/plain", head_only, status="404 Not Found")
            try:
                conn.sendall(reply)
            except OSError:
                pass

    @staticmethod
    def ok(body, ctype, head_only, status="200 OK"):
        head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n").encode()
        return head if head_only else head + body


def usage_checks(t, work):
    mnt = os.path.join(work, "mnt-usage")
    os.makedirs(mnt)
    cache = os.path.join(work, "cache-usage")

    r = subprocess.run([exe(), "--help"], capture_output=True, text=True, timeout=15)
    missing = [o for o in OPTIONS if f" {o}" not in r.stdout and f",{o}" not in r.stdout]
    t.check(r.returncode == 0 and not missing, "--help exits 0 and mentions every option",
            f"exit {r.returncode}, missing {missing}\n{r.stdout}{r.stderr}")

    rc, _, err = run(["--cache", cache, "--origin", "local=http://127.0.0.1:1/"], mnt)
    t.check(rc == 2 and one_clear_line(err, '"local"'),
            "an origin named local: exit 2 and one line naming it", f"exit {rc}: {err}")

    rc, _, err = run(["--cache", cache, "--origin", "www=ftp://127.0.0.1/pub/"], mnt)
    t.check(rc == 2 and one_clear_line(err, "ftp://127.0.0.1/pub/", "http"),
            "an origin URL that is not http(s): exit 2 and one line naming the URL", f"exit {rc}: {err}")

    rc, _, err = run(["--cache", cache, "--knob", "101"], mnt)
    t.check(rc == 2 and one_clear_line(err, "101", "0..100"), "--knob 101: exit 2 and one line giving the range",
            f"exit {rc}: {err}")

    profiles = sorted(f[:-5] for f in os.listdir(PROFILE_DIR) if f.endswith(".toml"))
    rc, _, err = run(["--cache", cache, "--profile", "no-such-machine"], mnt)
    t.check(rc == 2 and one_clear_line(err, "no-such-machine", "available", *profiles),
            "an unknown profile: exit 2 and one line listing the available profiles",
            f"exit {rc}: {err}\nexpected every one of {profiles}")

    # A cache directory that cannot be created (its parent is a regular file).
    blocker = os.path.join(work, "a-file")
    with open(blocker, "w") as f:
        f.write("not a directory\n")
    bad_cache = os.path.join(blocker, "cache")
    rc, _, err = run(["--cache", bad_cache, "--origin", "www=http://127.0.0.1:1/"], mnt)
    t.check(rc == 1 and no_crash(rc, err) and one_clear_line(err, bad_cache) and not os.path.ismount(mnt),
            "an uncreatable cache directory: exit 1, one line naming it, no crash, nothing mounted",
            f"exit {rc}: {err}")

    conf = os.path.join(work, "unknown-key.toml")
    with open(conf, "w") as f:
        f.write(f'cache = "{cache}"\nknob = 40\ncolour = "blue"\n[origins]\nwww = "http://127.0.0.1:1/"\n')
    rc, _, err = run(["--config", conf], mnt)
    t.check(rc == 2 and one_clear_line(err, f"{conf}:3", "colour"),
            "a config file with an unknown key: exit 2 naming the file, line 3 and the key", f"exit {rc}: {err}")

    conf = os.path.join(work, "bad-value.toml")
    with open(conf, "w") as f:
        f.write(f'# ghostfs\ncache = "{cache}"\ncache_size = "64M"\nknob = 101\n')
    rc, _, err = run(["--config", conf], mnt)
    t.check(rc == 2 and one_clear_line(err, f"{conf}:4", "knob"),
            "a config file with a bad value (knob = 101): exit 2 naming the file, line 4 and the key",
            f"exit {rc}: {err}")

    conf = os.path.join(work, "bad-passthrough.toml")
    with open(conf, "w") as f:
        f.write(f'cache = "{cache}"\npassthrough = "yes"\n')
    rc, _, err = run(["--config", conf], mnt)
    t.check(rc == 2 and one_clear_line(err, f"{conf}:2", "passthrough"),
            "a config file with passthrough = \"yes\" (not a boolean): exit 2 naming line 2 and the key",
            f"exit {rc}: {err}")

    conf = os.path.join(work, "no-such.toml")
    rc, _, err = run(["--config", conf], mnt)
    t.check(rc == 2 and one_clear_line(err, conf), "a missing config file: exit 2 and one line naming it",
            f"exit {rc}: {err}")


def first_errno(fn):
    try:
        fn()
        return 0
    except OSError as e:
        return e.errno


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def mounted_checks(t, work, nginx, raw, sums):
    origin_url = nginx.url() + "pub/"

    # A cache directory whose parents do not exist: ghostfs creates them (a path under the
    # test's directory, not /nonexistent, so nothing is left on the host).
    mnt = os.path.join(work, "mnt-deep")
    os.makedirs(mnt)
    deep = os.path.join(work, "nonexistent", "x", "y")
    fs = h.Ghostfs(mnt, deep, {"www": origin_url})
    ok = fs.start() and os.path.isdir(os.path.join(deep, "local")) and \
        read_all(os.path.join(mnt, "www", "small.txt")) == read_all(os.path.join(work, "origin", "pub", "small.txt"))
    t.check(ok, "--cache under missing parents creates them, mounts and serves", fs.output())
    fs.stop()

    # A config file (TOML, the keys of common/config/config.h, an [origins] table).
    mnt = os.path.join(work, "mnt-config")
    os.makedirs(mnt)
    conf = os.path.join(work, "good.toml")
    cache = os.path.join(work, "cache-config")
    ctl = os.path.join(work, "run", "config-control.sock")
    with open(conf, "w") as f:
        f.write(f"""# every key of common/config/config.h
cache = "{cache}"
cache_size = "64M"
knob = 30
control = "{ctl}"
max_stale = 0
heuristic_freshness = 300
write_queue_cap = "4M"
passthrough = true

[origins]
www = "{origin_url}"
""")
    fs = ArgvGhostfs(mnt, ["--config", conf])
    ok = fs.start() and sorted(os.listdir(mnt)) == ["local", "www"] and \
        h.sha256_file(os.path.join(mnt, "www", "dir1", "b.bin")) == sums["dir1/b.bin"]
    t.check(ok, "a config file with an [origins] table mounts and serves a file", fs.output())
    t.check(os.path.exists(ctl) and stat.S_ISSOCK(os.stat(ctl).st_mode) and os.path.isdir(os.path.join(cache, "local")),
            "the config file's cache and control keys are applied", fs.output())
    fs.stop()

    # One mount with the good origin and the raw one.
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, os.path.join(work, "cache"), {"www": origin_url, "raw": raw.url()})
    if not fs.start():
        t.check(False, "mounts with the good origin and the raw one", fs.output()[-2000:])
        t.skip_rest(PLAN, "not mounted")
        return
    www = os.path.join(mnt, "www")
    before = len(nginx.log_lines())

    # `..` is resolved by the kernel before ghostfs sees a name: the path means what its
    # normalised form means (outside the mount here), and the origin never sees a `..`.
    dotdot = os.path.join(www, "..", "..", "etc", "passwd")
    norm = os.path.normpath(dotdot)
    want = first_errno(lambda: os.stat(norm))
    got = first_errno(lambda: os.stat(dotdot))
    print(f"# stat {dotdot}: errno {got}; stat {norm}: errno {want}", flush=True)
    same = got == want and (got != 0 or os.stat(dotdot).st_ino == os.stat(norm).st_ino)
    inside = os.stat(os.path.join(www, "dir1", "..", "small.txt")).st_ino == os.stat(os.path.join(www, "small.txt")).st_ino
    t.check(same and inside, "`..` in a path is resolved by the kernel like the normalised path",
            f"{dotdot}: errno {got}, {norm}: errno {want}, inside {inside}")

    # Encoded dots are names, not parents: not in the listing, so not found, and not fetched.
    names = ["%2e%2e", "%2E%2E", ".%2e", "%2e%2e%2fsecret.txt", "..%2fsecret.txt", "%2e%2e%2f%2e%2e%2fetc%2fpasswd"]
    errs = {n: first_errno(lambda n=n: read_all(os.path.join(www, n))) for n in names}
    errs["%2e%2e/secret.txt"] = first_errno(lambda: read_all(os.path.join(www, "%2e%2e", "secret.txt")))
    t.check(all(e == errno.ENOENT for e in errs.values()), "names with '%2e%2e' are not found (ENOENT)", errs)

    # A file whose name really is "%2e%2e" is read as itself.
    got = first_errno(lambda: read_all(os.path.join(www, "lit", "%2e%2e")))
    data = read_all(os.path.join(www, "lit", "%2e%2e")) if got == 0 else b""
    t.check(data == b"literally %2e%2e\n", "a file named '%2e%2e' on the origin reads as itself",
            f"errno {got}, {data[:40]!r}")

    time.sleep(0.2)
    seen = nginx.log_lines()[before:]
    paths = [l.split('"')[1].split(" ")[1] for l in seen if l.count('"') >= 2 and " " in l.split('"')[1]]
    outside = [p for p in paths if not p.startswith("/pub/") or "secret" in p or "/../" in p or "passwd" in p]
    t.check(paths and not outside, "the origin saw requests under /pub/ only, none for a parent",
            "\n".join(outside or seen))

    # An origin that sends 10 of the 1000 bytes it announced, then closes.
    rawdir = os.path.join(mnt, "raw")
    listing = sorted(os.listdir(rawdir))
    t.check(listing == ["broken.bin", "plain"], "a raw origin's autoindex-like listing is read", listing)
    got = first_errno(lambda: read_all(os.path.join(rawdir, "broken.bin")))
    t.check(got == errno.EIO, "reading a body cut short by the origin fails with EIO",
            f"errno {got} ({os.strerror(got) if got else 'read succeeded'})\n{raw.requests}")
    ok = fs.proc.poll() is None and os.path.ismount(mnt) and \
        h.sha256_file(os.path.join(www, "medium.bin")) == sums["medium.bin"]
    t.check(ok, "after the truncated body the mount stays up and the good origin still reads", fs.output())

    # A directory URL that answers plain text, not a listing.
    got = first_errno(lambda: os.listdir(os.path.join(rawdir, "plain")))
    print(f"# listing raw/plain: errno {got} ({os.strerror(got) if got else 'no error'})", flush=True)
    t.check(got in (errno.EOPNOTSUPP, errno.EIO, errno.EPROTO, errno.EBADMSG),
            "listing a directory whose URL returns plain text fails with a clear errno",
            f"errno {got} ({os.strerror(got) if got else 'listing succeeded'})")
    ok = fs.proc.poll() is None and os.path.ismount(mnt) and \
        h.sha256_file(os.path.join(www, "dir1", "sub", "deep.txt")) == sums["dir1/sub/deep.txt"]
    t.check(ok, "after the bad listing the mount stays up and the good origin still reads", fs.output())

    out = fs.output()
    t.check(f"{raw.url()}broken.bin" in out and f"{raw.url()}plain/" in out,
            "the daemon's log names the URLs of both failures", out[-1500:])
    fs.stop()


def daemonised(args, mnt):
    """Runs ghostfs ARGS MNT without -f (it daemonises); returns (exit code, stderr)."""
    r = subprocess.run([exe(), *args, mnt], capture_output=True, text=True, timeout=30)
    return r.returncode, r.stderr


def lock_pid(cache):
    try:
        with open(os.path.join(cache, "lock")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


def stop_pid(mnt, pid):
    """Unmounts a daemonised ghostfs and waits until its process `pid` has gone."""
    if os.path.ismount(mnt):
        subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while pid and os.path.exists(f"/proc/{pid}") and time.time() < deadline:
        time.sleep(0.05)
    if h.is_mounted(mnt):  # a dead mount too (os.path.ismount says False for one)
        subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)


def ownership_checks(t, work, nginx, sums):
    """One daemon per cache directory (CACHE/lock names the holder), never on top of a mount."""
    if t.n >= PLAN:  # the mounted checks skipped the rest
        return
    origin = ["--origin", f"www={nginx.url()}pub/"]
    cache = os.path.join(work, "cache-owned")
    mnts = [os.path.join(work, f"mnt-owned-{i}") for i in range(4)]
    for m in mnts:
        os.makedirs(m)

    # Two in the foreground on one cache: the second refuses, naming the first's pid.
    first = h.Ghostfs(mnts[0], cache, {"www": nginx.url() + "pub/"})
    if not first.start():
        t.check(False, "mounts in the foreground on its cache", first.output()[-2000:])
        t.skip_rest(PLAN, "not mounted")
        return
    rc, _, err = run(["--cache", cache, *origin], mnts[1])
    ok = rc == 1 and one_clear_line(err, cache, f"pid {first.proc.pid}", "--cache") and \
        not os.path.ismount(mnts[1]) and \
        h.sha256_file(os.path.join(mnts[0], "www", "small.txt")) == sums["small.txt"]
    t.check(ok, "a second ghostfs on the same cache directory exits 1 naming the first's pid; "
            "the first still serves", f"exit {rc}: {err}")
    first.stop()

    # Both daemonised: the lock is held by the process that serves, after the fork.
    rc, err = daemonised(["--cache", cache, *origin], mnts[0])
    h.on_exit(lambda: stop_pid(mnts[0], lock_pid(cache)))
    pid = lock_pid(cache)
    serving = rc == 0 and h.wait_for(lambda: os.path.ismount(mnts[0]), 10) and pid > 0 and \
        os.path.exists(f"/proc/{pid}") and os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "ghostfs"
    rc2, err2 = daemonised(["--cache", cache, *origin], mnts[1])
    ok = serving and rc2 == 1 and one_clear_line(err2, f"pid {pid}") and not os.path.ismount(mnts[1])
    t.check(ok, "daemonised twice on one cache: CACHE/lock names the serving daemon and the second "
            "exits 1 naming it", f"first: exit {rc} {err} pid {pid}; second: exit {rc2}: {err2}")

    # On top of a live ghostfs mount.
    rc3, _, err3 = run(["--cache", os.path.join(work, "cache-other"), *origin], mnts[0])
    ok = rc3 == 1 and one_clear_line(err3, mnts[0], "already", "ghostfs", "fusermount3 -u") and \
        h.sha256_file(os.path.join(mnts[0], "www", "dir1", "a.txt")) == sums["dir1/a.txt"]
    t.check(ok, "mounting on a ghostfs mount point exits 1 with one clear line; the mount below "
            "still serves", f"exit {rc3}: {err3}")

    # A daemon killed by SIGKILL: its mount is dead (ENOTCONN), its lock is not stale.
    if pid > 0:
        os.kill(pid, signal.SIGKILL)
        h.wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10)
    rc4, _, err4 = run(["--cache", os.path.join(work, "cache-other"), *origin], mnts[0])
    t.check(rc4 == 1 and one_clear_line(err4, mnts[0], "fusermount3 -u"),
            "mounting on a dead FUSE mount exits 1 saying to unmount it first", f"exit {rc4}: {err4}")
    subprocess.run(["umount", "-l", mnts[0]], stderr=subprocess.DEVNULL)
    again = h.Ghostfs(mnts[2], cache, {"www": nginx.url() + "pub/"})
    ok = again.start() and h.sha256_file(os.path.join(mnts[2], "www", "small.txt")) == sums["small.txt"]
    t.check(ok, "after the holder was killed the cache directory is free again (no stale lock)",
            again.output())
    again.stop()


def main():
    if not os.path.exists(exe()):
        h.skip_all(f"{exe()} is not built")
    work = h.tempdir()
    t = h.Tap(PLAN)
    usage_checks(t, work)

    if os.geteuid() != 0:
        t.skip_rest(PLAN, "needs root to mount")
        t.done()
    if not os.path.exists("/dev/fuse"):
        t.skip_rest(PLAN, "/dev/fuse is missing")
        t.done()
    root = os.path.join(work, "origin")
    pub = os.path.join(root, "pub")
    os.makedirs(os.path.join(pub, "lit"))
    sums = h.make_tree(pub)
    with open(os.path.join(root, "secret.txt"), "w") as f:  # outside the origin's /pub/
        f.write("outside the origin\n")
    with open(os.path.join(pub, "lit", "%2e%2e"), "w") as f:
        f.write("literally %2e%2e\n")
    nginx = h.Nginx(root)
    if not nginx.start():
        t.skip_rest(PLAN, "nginx is not installed or did not start")
        t.done()
    raw = RawOrigin()
    mounted_checks(t, work, nginx, raw, sums)
    ownership_checks(t, work, nginx, sums)
    t.done()


if __name__ == "__main__":
    main()
