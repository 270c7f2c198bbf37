"""Shared pieces of the integration tests: TAP output, a real nginx on loopback, a mounted
ghostfs. Every test gets a fresh temporary directory; mounts and processes are cleaned up even
when a test fails (atexit + signal handlers), a process or mount the cleanups missed fails the
test, and a reaper cleans up after a test that was killed (tests/integration/leftovers.py)."""
import argparse
import atexit
import hashlib
import imaplib
import json
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leftovers  # noqa: E402

SKIP = 77


_tap = None  # the test's Tap, for the sanitizer check at exit


class Tap:
    def __init__(self, planned):
        global _tap
        self.n = 0
        self.failed = 0
        _tap = self
        print(f"1..{planned}", flush=True)

    def check(self, ok, name, detail=""):
        self.n += 1
        print(f"{'ok' if ok else 'not ok'} {self.n} - {name}", flush=True)
        if not ok:
            self.failed += 1
            for line in str(detail).splitlines()[:20]:
                print(f"# {line}", flush=True)
            # meson's failure report (and so CI's output) shows a failed test's stderr only
            print(f"not ok {self.n} - {name}", file=sys.stderr)
            for line in str(detail).splitlines()[:40]:
                print(f"# {line}", file=sys.stderr, flush=True)
        return ok

    def shortfall(self, ok, name, why, detail=""):
        """A goal not held yet: "ok" when met, else "not ok ... # TODO why", a known shortfall
        that is reported (scripts/count_tests.py lists it and counts it as skipped) but does not
        fail the test. Never "ok ... # TODO": meson counts that as an unexpected pass."""
        self.n += 1
        print(f"{'ok' if ok else 'not ok'} {self.n} - {name}" + ("" if ok else f" # TODO {why}"), flush=True)
        if not ok:
            for line in str(detail).splitlines()[:20]:
                print(f"# {line}", flush=True)
        return ok

    def skip(self, name, why):
        """A check that could not be exercised this run (e.g. a timing the loaded machine did
        not give): reported as skipped, never as passed."""
        self.n += 1
        print(f"ok {self.n} - {name} # SKIP {why}", flush=True)

    def skip_rest(self, planned, why):
        while self.n < planned:
            self.n += 1
            print(f"ok {self.n} # SKIP {why}", flush=True)

    def done(self):
        sys.exit(1 if self.failed else 0)


def skip_all(why):
    print(f"1..0 # SKIP {why}", flush=True)
    sys.exit(0)


def require_root_and_fuse():
    if os.geteuid() != 0:
        skip_all("needs root to mount")
    if not os.path.exists("/dev/fuse"):
        skip_all("/dev/fuse is missing")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, timeout):
    """Waits until something accepts TCP connections on 127.0.0.1:port."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


_cleanups = []


def wait_for(fn, timeout=15, interval=0.1):
    """Calls fn until it returns something true (returned) or `timeout` seconds pass (then its
    last value, or False). An exception counts as "not yet": the state is still changing."""
    deadline = time.time() + timeout
    while True:
        try:
            v = fn()
            if v:
                return v
        except Exception:  # noqa: BLE001 - anything may fail while the state changes
            v = False
        if time.time() >= deadline:
            return v
        time.sleep(interval)


def on_exit(fn):
    _cleanups.append(fn)


# What the test leaves behind (tests/integration/leftovers.py). Every program it starts
# inherits GHOST_TEST_MARK; the harness also records the pids it starts, its temporary
# directories and its mount points. At exit, after the cleanups, a process or a mount still
# there fails the test ("not ok N - the test left no process and no mount behind") and is
# removed. A reaper in a session of its own holds the same records and cleans up when the test
# is gone without its cleanups (SIGKILL: meson's timeout kills the test's process group 0.5 s
# after its SIGTERM).
_MARK = f"{os.getpid()}-{os.urandom(6).hex()}"
os.environ["GHOST_TEST_MARK"] = _MARK
_SESSION = os.getpid() if os.getsid(0) == os.getpid() else None  # meson: one session per test
_tracked = {}  # pid -> start time
_dirs, _points = [], []
_left_behind = False
try:
    _reaper = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "leftovers.py"), "reap"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True, text=True,
        env={k: v for k, v in os.environ.items() if k != "GHOST_TEST_MARK"})
except OSError:
    _reaper = None


def _tell(line):
    if _reaper is None or _reaper.stdin.closed:
        return
    try:
        _reaper.stdin.write(line + "\n")
        _reaper.stdin.flush()
    except OSError:
        pass


_tell(f"test {os.getpid()} {leftovers.start_time(os.getpid())}")
_tell(f"mark GHOST_TEST_MARK={_MARK}")
if _SESSION is not None:
    _tell(f"session {_SESSION}")


def track(proc):
    """Records a started process (Popen or pid): stopped at exit if the test's cleanups left it."""
    pid = proc if isinstance(proc, int) else proc.pid
    start = leftovers.start_time(pid)
    if start is not None:
        _tracked[pid] = start
        _tell(f"pid {pid} {start}")
    return proc


def stacks(pid, timeout=40):
    """Where a process waits, for a hang's report: every thread's backtrace from gdb (when it
    is installed), else each thread's kernel stack from /proc."""
    if shutil.which("gdb"):
        try:
            r = subprocess.run(["gdb", "-batch", "-nx", "-p", str(pid), "-ex", "thread apply all bt 30"],
                               capture_output=True, text=True, timeout=timeout)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("Thread ", "#"))]
            if lines:
                return "\n".join(lines)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return kernel_stacks(pid) or "?"


def kernel_stacks(pid):
    """Each thread's kernel stack (root) or wait channel, one line each: where a thread blocked
    in a system call waits (a FUSE request's answer, a page lock, an inode lock)."""
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task")) if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                name = fh.read().strip()
        except OSError:
            name = "?"
        for f in ("stack", "wchan"):
            try:
                with open(f"/proc/{pid}/task/{tid}/{f}") as fh:
                    out.append(f"thread {tid} ({name}): " + fh.read().strip().replace("\n", " | ")[:400])
                break
            except OSError:
                pass
    return "\n".join(out)


def fuse_device(mnt):
    """The device ("0:NN") of what is mounted at `mnt`, from /proc/self/mountinfo (not a stat,
    which a hung daemon would block), or None."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and leftovers._unescape(fields[4]) == mount_point(mnt):
                    return fields[2]
    except OSError:
        pass
    return None


def _fuse_connection(dev, name):
    """/sys/fs/fuse/connections/N/`name` of the FUSE connection of device `dev` ("0:N")."""
    conns = "/sys/fs/fuse/connections"
    if os.path.isdir(conns) and not os.listdir(conns):  # fusectl not mounted (systemd mounts it)
        # mount(2) itself: mount(8) stats mount points, and the hung mount's stat would hang too.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount(b"fusectl", conns.encode(), b"fusectl", ctypes.c_ulong(0), None)
    return f"{conns}/{dev.split(':')[1]}/{name}"


def fuse_waiting(mnt, dev=None):
    """The requests the kernel's FUSE connection of the mount at `mnt` (or of device `dev`)
    holds unanswered (/sys/fs/fuse/connections/N/waiting, N the device minor), or None."""
    dev = dev or fuse_device(mnt)
    try:
        with open(_fuse_connection(dev, "waiting")) as w:
            return int(w.read().strip())
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def mount_copies(dev):
    """The processes of other mount namespaces in which a mount of device `dev` is still there,
    one "PID COMMAND" per namespace. Where / has private propagation (containers, this CI), a
    namespace made while a FUSE file system was mounted (`ip netns exec`, `unshare -m`) keeps
    its own copy: the unmount here leaves the file system alive there, and its daemon is not
    told until the last copy goes."""
    try:
        ours = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return []
    looked, out = {ours}, []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
            if ns in looked:
                continue
            looked.add(ns)
            with open(f"/proc/{pid}/mountinfo") as f:
                if not any(len(fl) > 2 and fl[2] == dev for fl in (line.split() for line in f)):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        out.append(f"{pid} {cmd[:120]} ({ns})")
    return out


def fuse_abort(dev):
    """Aborts the FUSE connection of device `dev` (fusectl's abort): its daemon's reads then
    fail as after an unmount. True if the write was taken."""
    try:
        with open(_fuse_connection(dev, "abort"), "w") as f:
            f.write("1")
        return True
    except (OSError, IndexError, AttributeError):
        return False


def python_stacks():
    """Every other thread of this test: where it is, innermost frame last (for a hang's report)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue  # the reporting thread itself
        out.append(f"thread {names.get(ident, ident)}:")
        out += [ln.rstrip() for ln in traceback.format_stack(frame)[-6:]]
    return "\n".join(out)


def write_stacks(why, pids, mounts=()):
    """Writes `why`, this test's other threads' Python and kernel stacks, the requests each of
    `mounts`' FUSE connections holds unanswered (0: the daemon answered everything, so a
    thread waits in the kernel; more: a request waits for the daemon) and the processes'
    stacks to stderr (meson's report of a failed or timed-out test shows stderr)."""
    print(f"# {why}", file=sys.stderr, flush=True)
    print(python_stacks(), file=sys.stderr, flush=True)
    print(f"# this test's threads in the kernel:\n{kernel_stacks(os.getpid())}", file=sys.stderr, flush=True)
    for mnt in mounts:
        print(f"# FUSE requests unanswered on {mnt}: {fuse_waiting(mnt)}", file=sys.stderr, flush=True)
    for pid in pids:
        print(f"# process {pid}:\n{stacks(pid)}", file=sys.stderr, flush=True)


class Watchdog:
    """`with Watchdog(secs, pids_fn):` when the block runs past `secs`, writes this test's
    Python stacks and the stacks of the processes pids_fn() names to stderr, once: meson's
    timeout then kills a hung test with the hang's place in its report (meson shows stderr)."""

    def __init__(self, secs, pids_fn=lambda: []):
        self.timer = threading.Timer(secs, self._fire, args=(secs, pids_fn))
        self.timer.daemon = True

    def _fire(self, secs, pids_fn):
        write_stacks(f"watchdog: still running after {secs:.0f} s; where it waits:", pids_fn())

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()


def tracked_alive(names=("ghostfs", "ghostproxy")):
    """The pids track() recorded that still run one of the programs `names` (for a hang's
    report: the daemons, not the servers they talk to)."""
    alive = []
    for pid, start in _tracked.items():
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in names and leftovers.start_time(pid) == start:
            alive.append(pid)
    return alive


def track_mount(path):
    """Records a mount point: unmounted (lazily) at exit if it is still mounted, dead or alive."""
    path = os.path.abspath(path)
    _points.append(path)
    _tell(f"mount {path}")


def mount_point(path):
    """`path` made absolute with its parent resolved, as /proc/self/mountinfo names a mount
    point; not os.path.realpath(path), whose stat of the mount point waits for a hung daemon."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def holders(path):
    """The processes with a file, directory or cwd under `path` open: what makes its unmount
    fail with EBUSY. One "PID COMMAND: WHAT" line each."""
    out = []
    prefix = mount_point(path)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        seen = []
        for link in ["cwd", "root"] + [f"fd/{fd}" for fd in _listdir(f"/proc/{pid}/fd")]:
            try:
                target = os.readlink(f"/proc/{pid}/{link}")
            except OSError:
                continue
            if target == prefix or target.startswith(prefix + "/"):
                seen.append(f"{link} {target}")
        if seen:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                comm = "?"
            out.append(f"{pid} {comm}: {', '.join(seen)}")
    return out


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def unmount(path, tries=5):
    """fusermount3 -u `path`, tried again while it fails (EBUSY: a process still has something
    under it open). Returns None once unmounted, else what the last try said, with the
    processes holding the mount."""
    err = None
    for i in range(tries):
        r = subprocess.run(["fusermount3", "-u", path], capture_output=True, text=True)
        if r.returncode == 0 or not is_mounted(path):
            return None
        err = (r.stderr.strip() or f"exit {r.returncode}")
        time.sleep(0.2 * (i + 1))
    held = holders(path)
    return err + (f"; held by {'; '.join(held)}" if held else "; no process holds it")


def is_mounted(path):
    """True while anything is mounted at `path`, a dead FUSE mount included (os.path.ismount
    says False for one: its stat fails with ENOTCONN)."""
    return bool(leftovers.mounts(points=[path]))


def _check_left_behind():
    global _left_behind
    exclude = {_reaper.pid} if _reaper else set()
    found = leftovers.clean(f"GHOST_TEST_MARK={_MARK}", _SESSION, _tracked, _dirs, _points,
                            exclude=exclude, wait=5.0)
    if _reaper is not None:
        try:
            _reaper.stdin.close()  # the reaper finds nothing left and exits
        except OSError:
            pass
    if not found:
        return
    _left_behind = True
    n = (_tap.n if _tap else 0) + 1
    if _tap:
        _tap.n = n
    print(f"not ok {n} - the test left no process and no mount behind ({len(found)} left, removed now)",
          flush=True)
    for f in found:
        print(f"# {f}", flush=True)


def _run_cleanups(*_):
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception as e:  # cleanup must go on
            print(f"# cleanup: {e}", flush=True)


# Sanitizer reports (a build with -Db_sanitize=address,undefined, scripts/test.sh): every
# program this test starts, directly or not, writes its ASan/UBSan/LSan report to a file in
# one directory of ours instead of a stderr nobody reads (a daemon's goes to its log). After
# the cleanups have stopped every daemon, a report there fails the test with one more TAP
# line, "not ok N - no sanitizer report ...", quoting the reports (and the exit status 1).
_SANITIZER_DIR = tempfile.mkdtemp(prefix="ghost-sanitizer-")
for _var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
    _opts = os.environ.get(_var, "")
    if "log_path=" not in _opts:
        os.environ[_var] = (_opts + ":" if _opts else "") + f"log_path={_SANITIZER_DIR}/report"


def index_problems(cache):
    """What `PRAGMA integrity_check` finds wrong in each sqlite file under `cache` ([] if none);
    a cache without one is a problem too (nothing was checked)."""
    import sqlite3
    problems = []
    found = 0
    for dirpath, _, files in os.walk(cache):
        for n in files:
            if n.endswith(".sqlite"):
                found += 1
                db = sqlite3.connect(os.path.join(dirpath, n))
                try:
                    v = db.execute("PRAGMA integrity_check").fetchone()[0]
                    if v != "ok":
                        problems.append(f"{n}: {v}")
                finally:
                    db.close()
    if not found:
        problems.append(f"no index (*.sqlite) under {cache}")
    return problems


def sanitizer_reports():
    """[(file name, text)] of the sanitizer reports written so far by this test's programs."""
    out = []
    try:
        names = sorted(os.listdir(_SANITIZER_DIR))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(_SANITIZER_DIR, name), errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if text.strip():
            out.append((name, text))
    return out


def _check_sanitizer_reports():
    reports = sanitizer_reports()
    shutil.rmtree(_SANITIZER_DIR, ignore_errors=True)
    if not reports:
        if _left_behind:
            sys.stdout.flush()
            os._exit(1)
        return
    n = (_tap.n if _tap else 0) + 1
    print(f"not ok {n} - no sanitizer report from the programs this test ran "
          f"({len(reports)} report(s))", flush=True)
    for name, text in reports:
        lines = text.splitlines()
        keep = [l for l in lines if "ERROR:" in l or "runtime error:" in l or "SUMMARY:" in l
                or l.lstrip().startswith("#")][:40]
        print(f"# {name}:", flush=True)
        for line in keep or lines[:40]:
            print(f"#   {line}", flush=True)
    sys.stdout.flush()
    os._exit(1)


atexit.register(_check_sanitizer_reports)  # registered first: runs after the cleanups
atexit.register(_check_left_behind)  # after the cleanups, before the sanitizer check
atexit.register(_run_cleanups)
for _sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(_sig, lambda *a: (_run_cleanups(), sys.exit(1)))


def tempdir(prefix="ghost-test-"):
    d = tempfile.mkdtemp(prefix=prefix)
    _dirs.append(d)
    _tell(f"dir {d}")
    on_exit(lambda: shutil.rmtree(d, ignore_errors=True))
    return d


class Nginx:
    """nginx serving `root` with autoindex on 127.0.0.1, in the foreground, its own config."""

    def __init__(self, root, extra_location=""):
        self.root = root
        self.dir = tempdir("ghost-nginx-")
        self.port = free_port()
        self.access_log = os.path.join(self.dir, "access.log")
        self.extra = extra_location
        self.proc = None

    def conf(self):
        return f"""
worker_processes 1;
user root;
daemon off;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log {self.access_log};
  client_body_temp_path {self.dir}/body;
  proxy_temp_path {self.dir}/proxy;
  fastcgi_temp_path {self.dir}/fastcgi;
  uwsgi_temp_path {self.dir}/uwsgi;
  scgi_temp_path {self.dir}/scgi;
  types {{ text/html html; text/plain txt; application/octet-stream bin; text/css css; }}
  server {{
    listen 127.0.0.1:{self.port};
    root {self.root};
    autoindex on;
    {self.extra}
  }}
}}
"""

    def start(self):
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(nginx):
            return False
        with open(os.path.join(self.dir, "nginx.conf"), "w") as f:
            f.write(self.conf())
        self.proc = subprocess.Popen([nginx, "-c", os.path.join(self.dir, "nginx.conf"), "-p", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        track(self.proc)
        on_exit(self.stop)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None

    def url(self):
        return f"http://127.0.0.1:{self.port}/"

    def log_lines(self):
        try:
            with open(self.access_log) as f:
                return f.read().splitlines()
        except OSError:
            return []


class Dovecot:
    """A private dovecot IMAP server on 127.0.0.1 (TESTING.md recipe): its own config, base_dir,
    state_dir, log, password file and a mail user (uid 65534) whose Maildir is `maildir`."""

    UID = 65534

    def __init__(self, user="ghost", password="s3cret pass", extra_conf="", tls=False):
        self.dir = tempdir("ghost-dovecot-")
        # tls: imaps on its own port with a certificate for 127.0.0.1 signed by a CA made
        # here (self.ca_file); plain imap stays on self.port.
        self.tls = tls
        self.imaps_port = free_port() if tls else 0
        self.ca_file = os.path.join(self.dir, "ca.pem")
        os.chmod(self.dir, 0o755)  # the auth process reads the password file
        self.user, self.password = user, password
        self.port = free_port()
        self.home = os.path.join(self.dir, "home")
        self.maildir = os.path.join(self.home, "Maildir")
        self.conf_path = os.path.join(self.dir, "dovecot.conf")
        self.extra = extra_conf
        self.proc = None
        self.seeded = 0

    def available(self):
        return os.path.exists("/usr/sbin/dovecot") and os.geteuid() == 0

    def conf(self):
        d = self.dir
        return f"""protocols = imap
listen = 127.0.0.1
base_dir = {d}/base
state_dir = {d}/state
log_path = {d}/dovecot.log
{self.ssl_conf()}
disable_plaintext_auth = no
auth_mechanisms = plain login
mail_location = maildir:~/Maildir
mailbox_idle_check_interval = 1 secs
passdb {{
  driver = passwd-file
  args = {d}/passwd
}}
userdb {{
  driver = passwd-file
  args = {d}/passwd
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.port}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {self.imaps_port}
  }}
}}
{self.extra}
"""

    def ssl_conf(self):
        if not self.tls:
            return "ssl = no"
        return f"ssl = yes\nssl_cert = <{self.dir}/server.pem\nssl_key = <{self.dir}/server.key"

    def make_certs(self):
        """A CA and a server certificate for IP 127.0.0.1 signed by it (openssl CLI)."""
        d = self.dir

        def run(*args):
            subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/ca.key", "-out", self.ca_file,
            "-days", "2", "-subj", "/CN=ghost test CA")
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/server.key", "-out", f"{d}/server.csr",
            "-subj", "/CN=127.0.0.1")
        with open(f"{d}/san.ext", "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\n")
        run("x509", "-req", "-in", f"{d}/server.csr", "-CA", self.ca_file, "-CAkey", f"{d}/ca.key",
            "-CAcreateserial", "-out", f"{d}/server.pem", "-days", "2", "-extfile", f"{d}/san.ext")

    def _mkdir(self, path):
        os.makedirs(path, exist_ok=True)
        os.chown(path, self.UID, self.UID)

    def start(self):
        if not self.available():
            return False
        for sub in ("base", "state"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        for sub in ("", "/Maildir", "/Maildir/cur", "/Maildir/new", "/Maildir/tmp"):
            self._mkdir(self.home + sub)
        with open(os.path.join(self.dir, "passwd"), "w") as f:
            f.write(f"{self.user}:{{PLAIN}}{self.password}:{self.UID}:{self.UID}::{self.home}\n")
        if self.tls and not os.path.exists(os.path.join(self.dir, "server.pem")):
            self.make_certs()
        with open(self.conf_path, "w") as f:
            f.write(self.conf())
        # Its own process group, so stop() also takes down the imap processes serving
        # connections that are still open (a server that goes away, for the tests).
        self.proc = subprocess.Popen(["/usr/sbin/dovecot", "-F", "-c", self.conf_path],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        track(self.proc)
        on_exit(self.stop)
        return wait_port(self.port, 10) and (not self.tls or wait_port(self.imaps_port, 10))

    def stop(self):
        if self.proc and self.proc.poll() is None:
            subprocess.run(["/usr/bin/doveadm", "-c", self.conf_path, "stop"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass  # the group is gone already
        self.proc = None

    def url(self):
        return f"imap://{self.user}@127.0.0.1:{self.port}/"

    def imaps_url(self):
        return f"imaps://{self.user}@127.0.0.1:{self.imaps_port}/"

    def password_file(self):
        path = os.path.join(self.dir, "client-password")
        with open(path, "w") as f:
            f.write(self.password + "\n")
        os.chmod(path, 0o600)
        return path

    def seed(self, folder, data, info="", into_new=False):
        """Delivers one message (bytes) into folder ("" = INBOX, ".Name"), the Maildir way."""
        root = os.path.join(self.maildir, folder) if folder else self.maildir
        for sub in ("", "/cur", "/new", "/tmp"):
            self._mkdir(root + sub)
        self.seeded += 1
        name = f"{int(time.time())}.seed{self.seeded}.ghosttest"
        tmp = os.path.join(root, "tmp", name)
        with open(tmp, "wb") as f:
            f.write(data)
        os.chown(tmp, self.UID, self.UID)
        dest = os.path.join(root, "new", name) if into_new else os.path.join(root, "cur", name + ":2," + info)
        os.rename(tmp, dest)
        return dest

    def login(self):
        """An imaplib session straight to dovecot, logged in: the server's own view."""
        import imaplib
        c = imaplib.IMAP4("127.0.0.1", self.port)
        c.login(self.user, self.password)
        return c

    def uid_flags(self, uid, folder="INBOX"):
        """The FLAGS dovecot itself holds for message `uid` (str or bytes), read-only."""
        c = self.login()
        try:
            c.select(folder, readonly=True)
            return c.uid("FETCH", uid, "(FLAGS)")[1][0]
        finally:
            c.logout()

    def messages(self, folder="INBOX"):
        """[(flags, body)] of `folder` as dovecot holds them, in UID order, read-only."""
        c = self.login()
        try:
            c.select(folder, readonly=True)
            out = []
            for item in c.uid("FETCH", "1:*", "(FLAGS BODY.PEEK[])")[1]:
                if isinstance(item, tuple):
                    out.append((item[0].decode().split("FLAGS (")[1].split(")")[0].split(), item[1]))
            return out
        finally:
            c.logout()

    def bodies(self, folder="INBOX"):
        """The bodies of `folder` as dovecot holds them, sorted."""
        return sorted(b for _, b in self.messages(folder))

    def log(self):
        try:
            with open(os.path.join(self.dir, "dovecot.log")) as f:
                return f.read()
        except OSError:
            return ""


def imap_read_until(f, tag):
    """IMAP from a socket file `f`: every byte up to and including the line starting with
    `tag`, literals ({n} and {n+}) read whole; what came if the server closed first."""
    out = b""
    while True:
        line = f.readline()
        if not line:
            return out
        out += line
        if line.rstrip(b"\r\n").endswith(b"}"):
            n = int(line.rstrip(b"\r\n").rsplit(b"{", 1)[1][:-1].rstrip(b"+"))
            out += f.read(n)
            continue
        if line.startswith(tag):
            return out


def started_nginx(root, extra_location=""):
    """A started Nginx(root, extra_location), or the whole test skipped when nginx is missing
    or does not start."""
    nginx = Nginx(root, extra_location=extra_location)
    if not nginx.start():
        skip_all("nginx is not installed or did not start")
    return nginx


def started_dovecot(**kwargs):
    """A started Dovecot(**kwargs), or the whole test skipped when dovecot is missing or does
    not start."""
    dc = Dovecot(**kwargs)
    if not dc.available():
        skip_all("dovecot is not installed")
    if not dc.start():
        skip_all("dovecot did not start: " + dc.log()[-500:])
    return dc


def sleeping_card_mount(t, plan, work):
    """nginx on an empty site in `work`/www and a ghostfs on it with the ipaq-2004's emulated
    devices, whose card sleeps in PSM and wakes to CAM for transfers, and a control socket:
    what the tests of the mail the proxy holds back stand beside. (mnt, ctl); the rest of the
    plan skipped when nginx or ghostfs does not start."""
    www = os.path.join(work, "www")
    os.makedirs(www)
    nginx = Nginx(www)
    if not nginx.start():
        t.skip_rest(plan, "nginx did not start")
        t.done()
    _, mnt, ctl = mount_origin(t, plan, work, nginx.url(), args=["--profile", "ipaq-2004"])
    return mnt, ctl


def held_mail(plan, messages):
    """The start of a test of the mail ghostproxy holds back: root and /dev/fuse, a started
    dovecot with `messages` (bytes) delivered into its INBOX (else the test is skipped), the TAP
    plan, a fresh work directory with the sleeping card's mount (sleeping_card_mount) and an
    ImapJournalProxy on it, not started. Returns (t, dc, imap); imap.work, imap.mnt and
    imap.ctl are the directory, the mount and its control socket."""
    require_root_and_fuse()
    dc = started_dovecot()
    for m in messages:
        dc.seed("", m)
    t = Tap(plan)
    work = tempdir()
    mnt, ctl = sleeping_card_mount(t, plan, work)
    return t, dc, ImapJournalProxy(work, mnt, ctl, dc)


class ImapJournalProxy:
    """ghostproxy as an IMAP proxy with a journal (`work`/imap-journal) in front of dovecot
    `dc`, beside the mount `mnt` (control socket `ctl`). Each start() is a new process on the
    same IMAP port and journal, stopped when the test exits; the output of all of them goes to
    one log."""

    def __init__(self, work, mnt, ctl, dc):
        self.work, self.mnt, self.ctl, self.dc = work, mnt, ctl, dc
        self.journal = os.path.join(work, "imap-journal")
        self.port = free_port()
        self.log = os.path.join(work, "ghostproxy.log")

    def start(self, deadline=300):
        """A started ghostproxy (Popen) holding changes back for up to `deadline` seconds."""
        conf = os.path.join(self.work, f"proxy-{deadline}.toml")
        with open(conf, "w") as f:
            f.write(f"imap_deadline = {deadline}\n")
        p = subprocess.Popen([os.path.join(build_dir(), "proxy", "ghostproxy"),
                              "--listen", f"127.0.0.1:{free_port()}", "--mount", self.mnt,
                              "--control", self.ctl, "--config", conf,
                              "--imap-listen", f"127.0.0.1:{self.port}",
                              "--imap-origin", f"imap://127.0.0.1:{self.dc.port}/",
                              "--imap-journal", self.journal],
                             stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        track(p)
        on_exit(lambda: p.poll() is None and (p.terminate(), p.wait(10)))
        return p

    def start_checked(self, t, plan, deadline=300):
        """start(deadline) as the TAP check "ghostproxy listens for IMAP with --imap-journal"
        (within 15 s); the rest of the plan is skipped and the test ends when it does not.
        Returns the Popen."""
        p = self.start(deadline)
        if not t.check(wait_port(self.port, 15), "ghostproxy listens for IMAP with --imap-journal", self.tail()):
            t.skip_rest(plan, "no IMAP proxy")
            t.done()
        return p

    def tail(self, n=600):
        """The last `n` characters of the proxies' log."""
        with open(self.log) as f:
            return f.read()[-n:]


class OrderedIMAP4(imaplib.IMAP4):
    """imaplib.IMAP4 that also keeps the untagged EXISTS and EXPUNGE in the order they came
    (`events`, ("EXISTS"|"EXPUNGE", number)): imaplib files untagged responses by kind, so an
    EXISTS followed by an EXPUNGE in one response (a message another client added, announced by
    the same command that expunges) cannot be told from the reverse, and the count the client
    is left with is only known in order. `known` is free for the test's running count."""

    def __init__(self, *args):
        self.events, self.known = [], 0
        super().__init__(*args)

    def _append_untagged(self, typ, dat):
        if typ in ("EXISTS", "EXPUNGE") and isinstance(dat, bytes) and dat.isdigit():
            self.events.append((typ, int(dat)))
        super()._append_untagged(typ, dat)


class Tmux:
    """A private tmux server (its own socket) running one session, "ghost", for a terminal
    program (neomutt); killed when the test exits."""

    def __init__(self, name):
        self.sock = f"{name}-{os.getpid()}"
        on_exit(lambda: self.run("kill-server"))

    def run(self, *args):
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True,
                              timeout=10)

    def start(self, command, width=160, height=40):
        return self.run("new-session", "-d", "-s", "ghost", "-x", str(width), "-y", str(height),
                        command)

    def keys(self, *keys):
        return self.run("send-keys", "-t", "ghost", *keys)

    def screen(self):
        return self.run("capture-pane", "-p", "-t", "ghost").stdout

    def wait_screen(self, pred, timeout=20):
        """(True, text) once pred(screen text) holds, else (False, the last text) at timeout."""
        deadline = time.time() + timeout
        text = ""
        while time.time() < deadline:
            text = self.screen()
            if pred(text):
                return True, text
            time.sleep(0.3)
        return False, text


def cpu_seconds(pid):
    """CPU seconds (user + system) `pid` has used: a daemon's cost apart from the machine's load."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def build_dir():
    return os.environ.get("GHOST_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))


def flash_dirs():
    """A fresh work directory for one flash-log mount: (work, mnt (made), cache, flash log
    directory, control socket)."""
    work = tempdir()
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    return work, mnt, os.path.join(work, "cache"), os.path.join(work, "flash"), os.path.join(work, "control.sock")



# Seconds Ghostfs.stop() waits for the daemon's exit after its unmount before killing it.
STOP_WAIT = 30


class Ghostfs:
    def __init__(self, mnt, cache, origins, args=(), control=None, log=None):
        self.mnt = mnt
        self.cache = cache
        self.origins = origins
        self.args = list(args)
        self.control = control
        self.proc = None
        # The daemon's output (appended: again() keeps one log across remounts).
        self.log = log or os.path.join(tempdir("ghost-log-"), "ghostfs.log")
        # stop(): seconds from the unmount to the daemon's exit, and whether it had to be
        # killed (it did not exit within STOP_WAIT s: what it had not flushed yet is not on the
        # disk, though what its flash log holds is replayed at the next mount).
        self.stop_seconds = None
        self.stop_killed = False
        self.exit_code = None
        self.unmount_error = None
        self.dev = None  # the mount's device ("0:N"): its FUSE connection in /sys/fs/fuse/connections
        self.held_elsewhere = []  # stop(): the other mount namespaces that still had the mount

    def command(self):
        """The daemon's command line (in the foreground)."""
        cmd = [os.path.join(build_dir(), "fs", "ghostfs"), "-f", "--cache", self.cache]
        for name, url in self.origins.items():
            cmd += ["--origin", f"{name}={url}"]
        if self.control:
            cmd += ["--control", self.control]
        return cmd + self.args + [self.mnt]

    def start(self, timeout=10):
        """Starts the daemon; True once its mount is there, False if it exits or `timeout`
        seconds pass first. Stopped (and unmounted) when the test exits."""
        self.logf = open(self.log, "a")
        self.proc = subprocess.Popen(self.command(), stdout=self.logf, stderr=subprocess.STDOUT)
        track(self.proc)
        track_mount(self.mnt)
        on_exit(self.stop)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.ismount(self.mnt):
                self.dev = fuse_device(self.mnt)
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def stop(self):
        if self.proc is None:
            return
        t0 = time.monotonic()
        # Asked of /proc/self/mountinfo, not os.path.ismount: that stats the mount's root through
        # the daemon and says False when the stat fails, and then the daemon was never told.
        self.unmount_error = None
        if is_mounted(self.mnt):
            self.unmount_error = unmount(self.mnt)
        self.held_elsewhere = []
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            # Unmounted here, but the daemon was not told: another mount namespace may hold a
            # copy of the mount (stop 28's CI: the replay's tcpdump, started by `ip netns exec`
            # beside ghostfs_flash_edit, kept its mount alive and the daemon was killed with its
            # unmount flush not begun). That is the test machine's doing, not the daemon's: say
            # who holds it and abort the connection, which the daemon takes as the unmount.
            if self.unmount_error is None and self.dev and not is_mounted(self.mnt):
                self.held_elsewhere = mount_copies(self.dev)
                if self.held_elsewhere:
                    aborted = fuse_abort(self.dev)
                    print(f"# ghostfs ({self.mnt}) was unmounted here but is still mounted in another mount "
                          f"namespace, held by {'; '.join(self.held_elsewhere)}: its daemon is not told while "
                          f"they live; {'aborted its FUSE connection' if aborted else 'could not abort its FUSE connection'} "
                          f"so that it runs its unmount flush", file=sys.stderr, flush=True)
        try:
            # 30 s in all: the unmount's flush of the write queue and the flash log may spin a
            # disk up and fsync, seconds on a busy machine.
            self.proc.wait(max(0.0, STOP_WAIT - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            # Where it waits, before the kill: its threads' stacks and what the kernel still
            # holds for it.
            write_stacks(f"ghostfs ({self.mnt}) has not exited {STOP_WAIT} s after its unmount "
                         f"(FUSE requests unanswered: {fuse_waiting(self.mnt, self.dev)}; still mounted in other mount "
                         f"namespaces: {mount_copies(self.dev) if self.dev else '?'})", [self.proc.pid])
            self.proc.kill()
            self.proc.wait()
            self.stop_killed = True
        self.stop_seconds = time.monotonic() - t0
        self.exit_code = self.proc.returncode
        if self.stop_killed or self.exit_code != 0:
            # meson's report shows stderr only: a daemon that died at its unmount (a sanitizer's
            # abort, a crash) or did not finish its flush in time is seen there.
            how = f"did not exit within {STOP_WAIT} s of its unmount and was killed" if self.stop_killed else \
                f"exited with status {self.exit_code} at its unmount"
            if self.unmount_error:
                how += f" (the unmount failed: {self.unmount_error})"
            print(f"# ghostfs ({self.mnt}) {how}; the tail of its log {self.log}:", file=sys.stderr)
            try:
                with open(self.log, errors="replace") as f:
                    for line in f.read().splitlines()[-30:]:
                        print(f"#   {line}", file=sys.stderr)
            except OSError:
                pass
            sys.stderr.flush()
        if is_mounted(self.mnt):  # dead (the daemon was killed) or still busy
            subprocess.run(["umount", "-l", self.mnt], stderr=subprocess.DEVNULL)
        self.proc = None

    def start_ready(self, timeout=120):
        """Starts the daemon and waits for its first `stats` answer on the control socket: the
        mount is ready, its index loaded. Returns (seconds from the exec to that answer, the
        index's object count), or (None, None) when it does not mount or answer within `timeout`
        seconds; self.ready_cpu_s is then the CPU seconds the daemon had used."""
        t0 = time.monotonic()
        if not self.start(timeout=timeout):
            return None, None
        while time.monotonic() - t0 < timeout:
            try:
                ctl = Control(self.control)
                stats = ctl.ok("stats")
                ctl.close()
                self.ready_cpu_s = cpu_seconds(self.proc.pid)
                return time.monotonic() - t0, stats.get("cache", {}).get("objects")
            except (OSError, RuntimeError):
                time.sleep(0.01)
        return None, None

    def again(self):
        """A new Ghostfs on the same mount point, cache, origins, arguments and control socket,
        not started yet: the remount after a stop or a kill9()."""
        return Ghostfs(self.mnt, self.cache, self.origins, args=self.args, control=self.control, log=self.log)

    def kill9(self):
        self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            # A thread of the killed daemon can stay in the kernel: its page invalidation
            # (FUSE_NOTIFY_INVAL_INODE, fs/inval_notifier.h) waits for a page lock held by a READ
            # the dead loop will never answer, and its write keeps /dev/fuse open, so the kernel
            # neither aborts the connection nor reaps the process (seen: ghostfs_evict_random
            # hung 10 min in kill9). Aborting the connection (umount -f) releases it, as an
            # administrator would; said here, not hidden.
            print(f"# ghostfs pid {self.proc.pid} still there 10 s after SIGKILL (a thread waits in the kernel); "
                  f"aborting its FUSE connection: umount -f {self.mnt}", flush=True)
            subprocess.run(["umount", "-f", self.mnt], stderr=subprocess.DEVNULL)
            self.proc.wait(timeout=60)
        subprocess.run(["umount", "-l", self.mnt], stderr=subprocess.DEVNULL)
        self.proc = None

    def output(self):
        try:
            with open(self.log) as f:
                return f.read()
        except OSError:
            return ""


def ghostctl(control, *args, timeout=30):
    """ghostctl --control CONTROL ARGS..., run to its end: the CompletedProcess (text)."""
    exe = os.path.join(build_dir(), "fs", "ghostctl")
    return subprocess.run([exe, "--control", control, *args], capture_output=True, text=True, timeout=timeout)


def ghostctl_json(control, *args):
    """ghostctl --json's answer to ARGS, parsed (an exception when there is none)."""
    return json.loads(ghostctl(control, "--json", *args).stdout)


class Control:
    """A client of ghostfs's control socket (common/control/control.h), one request at a time."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(path)
        self.f = self.sock.makefile("rw")
        self.next_id = 1

    def call(self, op, **args):
        self.next_id += 1
        self.f.write(json.dumps({"id": self.next_id, "op": op, **args}) + "\n")
        self.f.flush()
        reply = json.loads(self.f.readline())
        assert reply["id"] == self.next_id, reply
        return reply

    def ok(self, op, **args):
        r = self.call(op, **args)
        if not r["ok"]:
            raise RuntimeError(f"{op}: {r['error']}")
        return r["result"]

    def ghost_hints(self, device="cisco-350", n=20):
        """Sends `n` ghost hints for `device` pipelined (so they come well within the card's
        break-even time even on a loaded machine) and reads their replies. Hints count as
        transfers (DESIGN §3.3): a first burst teaches the STPM module, a later one switches the
        card to CAM, which is how the tests wake ghostfs's emulated card."""
        for i in range(n):
            self.f.write(json.dumps({"id": 1000 + i, "op": "hint", "kind": "ghost", "device": device,
                                     "time_s": 0.5, "energy_j": 0.5}) + "\n")
        self.f.flush()
        for i in range(n):
            self.f.readline()

    def close(self):
        self.f.close()
        self.sock.close()


def seeded_options(**options):
    """The command line of a seeded random test, parsed: --seed (default $GHOST_SEED, else a
    fresh one; 0 counts as unset) and one option a keyword, --name (underscores as dashes) with
    the keyword's value as default and its type. Prints the seed and the options that replay the
    run as a TAP comment."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int,
                    default=int(os.environ.get("GHOST_SEED") or 0) or random.SystemRandom().randrange(1, 10 ** 6))
    for name, default in options.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    opts = ap.parse_args()
    replay = " ".join(f"--{name.replace('_', '-')} {getattr(opts, name)}" for name in options)
    print(f"# seed {opts.seed} (replay: --seed {opts.seed} {replay})", flush=True)
    return opts


def make_tree(root, seed=1):
    """A tree with small, large and nested files; returns {relative path: sha256}."""
    rng = random.Random(seed)
    sums = {}
    layout = {
        "small.txt": 100, "empty.txt": 0, "page.html": 5000, "medium.bin": 300_000,
        "large.bin": 6 * 1024 * 1024, "dir1/a.txt": 4096, "dir1/b.bin": 70_000,
        "dir1/sub/deep.txt": 12_345, "dir2/with space.txt": 777, "dir2/ünï.txt": 64,
    }
    for rel, size in layout.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = rng.randbytes(size)
        with open(path, "wb") as f:
            f.write(data)
        sums[rel] = hashlib.sha256(data).hexdigest()
    return sums


def mark_old(maildir):
    """Moves every message of a Maildir's new/ to cur/ unread, as mutt does when it leaves a
    mailbox (mark_old): ghostfs shows unseen server mail in new/, and tests written for cur/
    call this after mounting. Returns the names moved."""
    moved = []
    for name in os.listdir(os.path.join(maildir, "new")):
        os.rename(os.path.join(maildir, "new", name), os.path.join(maildir, "cur", name))
        moved.append(name)
    return moved


def mount_origin(t, plan, work, origin, args=(), check=None, control=True):
    """ghostfs mounted at WORK/mnt on the cache WORK/cache, with `origin` as www/ (a URL) or
    each name of `origin` (a dict name -> URL), the extra command line `args`, and its control
    socket at WORK/control.sock (control=False: none). With `check`, the mount is the TAP check
    of that name (the daemon's log as its detail). Without, a failed mount is a failed check
    "ghostfs mounts" (our own daemon not mounting is a failure, never a skip). Either way the
    rest of the plan is skipped and the test ends when it does not mount. Returns (fs, mnt, control socket or None); fs.cache is the cache."""
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    ctl = os.path.join(work, "control.sock") if control else None
    origins = origin if isinstance(origin, dict) else {"www": origin}
    fs = Ghostfs(mnt, os.path.join(work, "cache"), origins, args=args, control=ctl)
    up = fs.start()
    if check is not None:
        t.check(up, check, fs.output()[-2000:])
    elif not up:
        t.check(False, "ghostfs mounts", fs.output()[-2000:])
    if not up:
        t.skip_rest(plan, "ghostfs did not mount")
        t.done()
    return fs, mnt, ctl


def mount_seeded(t, plan, work, origin, rng, check, args=()):
    """mount_origin for a seeded random test: heuristic freshness on (WORK/ghostfs.toml) and,
    on one draw of `rng` in two, the ipaq-2004 profile (operations wait for the card's CAM),
    printed so a replay can be read; the mount is the check `check`. Returns what mount_origin
    does; fs.again() remounts the same way."""
    conf = os.path.join(work, "ghostfs.toml")
    with open(conf, "w") as f:
        f.write("heuristic_freshness = 1\n")
    drawn = ["--profile", "ipaq-2004"] if rng.random() < 0.5 else []
    print(f"# mount args: {drawn}", flush=True)
    return mount_origin(t, plan, work, origin, args=[*args, "--config", conf, *drawn], check=check)


def read_bytes(path):
    """The whole file at `path` (through the mount: one open, reads to the end, close)."""
    with open(path, "rb") as f:
        return f.read()


def vmstat(names):
    """{counter: value} of the /proc/vmstat counters `names` (those the kernel has): how a test
    tells that the kernel dropped or reclaimed its caches meanwhile (drop_pagecache, drop_slab,
    slabs_scanned, pgsteal_file), which another test's drop_caches() does machine-wide."""
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            name, _, value = line.partition(" ")
            if name in names:
                out[name] = int(value)
    return out


def drop_caches():
    """Empties the kernel's page, dentry and inode caches (root), so the next read of a mounted
    file goes to the file system."""
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def serve_tree(extra_location=""):
    """The common start of a mount test: root and /dev/fuse (else skip), a fresh work dir, the
    generated tree served by nginx (else skip). Returns (work, origin root, sums, nginx)."""
    require_root_and_fuse()
    work = tempdir()
    root = os.path.join(work, "origin")
    os.makedirs(root)
    sums = make_tree(root)
    return work, root, sums, started_nginx(root, extra_location)


def ghost_key_hash(key):
    """A cache key's 64-bit hash as ghostfs's index stores it (objects.h, the SQL function
    ghost_h): the first 8 bytes of its SHA-256, big-endian, as a signed integer (0 reads as 1)."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") or 1
    return h - (1 << 64) if h >= 1 << 63 else h


def add_cached_objects(index, rows):
    """Writes complete objects straight into a closed ghostfs cache index (its
    objects-db/index.sqlite, schema 5) in one transaction: `rows` yields (key, size, etag,
    last_modified, content_type, expires_us, fetched_us, accessed_us, response, body), body a
    packed body (bytes) or None for a body file the caller puts in place. For caches of 100k+
    objects in tests and benchmarks, whose fill through the proxy takes minutes to hours. The
    shutdown mark is left as it was. Returns the number of rows written."""
    import sqlite3
    db = sqlite3.connect(index)
    try:
        db.create_function("ghost_h", 1, ghost_key_hash, deterministic=True)
        n = [0]

        def counted():
            for r in rows:
                n[0] += 1
                yield tuple(r) + (ghost_key_hash(r[0]),)
        with db:
            db.executemany(
                "INSERT INTO objects(key, size, etag, last_modified, content_type, expires_us, "
                "fetched_us, accessed_us, response, body, h, complete) "
                "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)", counted())
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()
    return n[0]
