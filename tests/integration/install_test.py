#!/usr/bin/env python3
"""Ghost installed as a system tool (TAP):
  - scripts/make-deb.sh packs `meson install` of this build (no second build); lintian finds
    no error or warning; the package unpacked with dpkg -x (the machine is not changed) runs:
    --version of every program, ghostsim on a shipped trace with a shipped profile found at
    the unpacked prefix with no source tree and no $GHOST_PROFILE_DIR, an unknown profile's
    error naming where it looked, man pages and systemd units present;
  - the fstab form mounts: mount.fuse3 -t fuse.ghostfs (what mount(8) runs for a line of type
    fuse.ghostfs) and mount(8) on an fstab line, each reading a file from nginx on loopback
    and unmounting;
  - ghostproxy started by socket activation (LISTEN_FDS=1, a listening socket on fd 3, as a
    .socket unit passes it) serves through that socket.
Needs root and /dev/fuse for the mount parts (else skip), dpkg-deb and lintian for the
package parts (else skip)."""
import gzip
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROGRAMS = ["ghostfs", "ghostctl", "ghostproxy", "ghostsim", "ghosttrace"]
MAN_PAGES = ["man1/ghostfs.1.gz", "man1/ghostctl.1.gz", "man1/ghostproxy.1.gz",
             "man1/ghostsim.1.gz", "man1/ghosttrace.1.gz", "man5/ghostfs.conf.5.gz",
             "man5/ghostproxy.conf.5.gz"]
UNITS = ["system/ghostfs.service", "system/ghostproxy.service", "system/ghostproxy.socket",
         "user/ghostfs.service", "user/ghostproxy.service", "user/ghostproxy.socket"]
PLANNED = 12


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


def project_version(build):
    info = run(["meson", "introspect", "--projectinfo", build])
    return json.loads(info.stdout)["version"]


def package_tests(t, build, work):
    if not shutil.which("dpkg-deb") or not shutil.which("lintian"):
        t.skip_rest(7, "dpkg-deb or lintian is not installed")
        return
    # xz at level 1: the sanitizer build's package took ~300 s to pack at dpkg's 6 on a loaded
    # machine (the test's whole budget); what is checked does not depend on the level
    made = run([os.path.join(SRC, "scripts", "make-deb.sh"), build, work], env={**os.environ, "GHOST_DEB_LEVEL": "1"})
    deb = made.stdout.strip().splitlines()[-1] if made.stdout.strip() else ""
    if not t.check(made.returncode == 0 and os.path.isfile(deb), "make-deb.sh builds a .deb",
                   made.stdout + made.stderr):
        t.skip_rest(7, "no package")
        return
    lint = run(["lintian", "--fail-on", "error,warning", "--suppress-tags",
                "initial-upload-closes-no-bugs", deb])
    t.check(lint.returncode == 0, "lintian reports no error or warning", lint.stdout + lint.stderr)
    depends = run(["dpkg-deb", "-f", deb, "Depends"]).stdout
    t.check("libfuse3" in depends and "libcurl" in depends and "fuse3" in depends,
            "Depends names the shared libraries the programs use", depends)

    root = os.path.join(work, "unpacked")
    run(["dpkg-deb", "-x", deb, root])
    env = {k: v for k, v in os.environ.items() if k != "GHOST_PROFILE_DIR"}
    version = project_version(build)
    outs = {p: run([os.path.join(root, "usr", "bin", p), "--version"], env=env) for p in PROGRAMS}
    t.check(all(o.returncode == 0 and o.stdout.strip() == f"{p} {version}" for p, o in outs.items()),
            "every installed program prints its name and the project version with --version",
            "\n".join(f"{p}: rc={o.returncode} {o.stdout!r} {o.stderr!r}" for p, o in outs.items()))

    # The installed ghostsim, run from outside the source tree: profiles and traces from the
    # unpacked prefix only.
    trace = os.path.join(root, "usr", "share", "ghost", "traces", "web.trace")
    sim = run([os.path.join(root, "usr", "bin", "ghostsim"), "--profile", "ipaq-2004", trace],
              env=env, cwd=work)
    ok = sim.returncode == 0
    try:
        result = json.loads(sim.stdout.splitlines()[0]) if ok else None
    except (ValueError, IndexError):
        result = None
    t.check(ok and isinstance(result, dict),
            "installed ghostsim replays a shipped trace with a shipped profile from its prefix",
            sim.stdout[:500] + sim.stderr)
    bad = run([os.path.join(root, "usr", "bin", "ghostsim"), "--profile", "no-such", trace],
              env=env, cwd=work)
    t.check(bad.returncode != 0 and os.path.join(root, "usr", "share", "ghost", "profiles") in bad.stderr,
            "an unknown profile's error names the installed profile directory", bad.stderr)

    missing = [m for m in MAN_PAGES if not os.path.isfile(os.path.join(root, "usr", "share", "man", m))]
    missing += [u for u in UNITS if not os.path.isfile(os.path.join(root, "usr", "lib", "systemd", u))]
    if not missing:
        with gzip.open(os.path.join(root, "usr", "share", "man", "man1", "ghostfs.1.gz"), "rt") as f:
            page = f.read()
        if ".TH \"ghostfs\" \"1\"" not in page or "--version" not in page.replace("\\-", "-"):
            missing.append("ghostfs.1 is not a man page naming --version")
    t.check(not missing, "man pages of every program and config file, and the systemd units, are installed",
            "missing: " + ", ".join(missing))


def mount_and_read(t, name, cmd, mnt, sums, env=None):
    """Runs a mount command, reads a file through the mount, unmounts: two checks."""
    h.on_exit(lambda: subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL))
    m = run(cmd, env=env)
    mounted = m.returncode == 0 and os.path.ismount(mnt)
    detail = m.stdout + m.stderr
    data_ok = False
    if mounted:
        try:
            data_ok = h.sha256_file(os.path.join(mnt, "www", "dir1", "a.txt")) == sums["dir1/a.txt"]
        except OSError as e:
            detail += str(e)
    t.check(mounted and data_ok, f"{name} mounts and serves a file from nginx", detail)
    u = run(["umount", mnt])
    t.check(u.returncode == 0 and h.wait_for(lambda: not os.path.ismount(mnt), timeout=10),
            f"umount of the {name} mount", u.stderr)


def fstab_mount_tests(t, build, work, nginx, sums):
    ghostfs = os.path.join(build, "fs", "ghostfs")
    options = (f"origin=www={nginx.url()},rw,nodev,nosuid,noauto,_netdev,"
               "x-systemd.automount")
    # What mount(8) runs for an fstab line of type fuse.ghostfs: mount.fuse3 -t fuse.ghostfs,
    # which runs `ghostfs SOURCE MOUNTPOINT -o OPTIONS` from $PATH (mount(8) itself gives
    # helpers a fixed PATH, where only an installed ghostfs is).
    mnt = os.path.join(work, "mnt-helper")
    os.makedirs(mnt)
    env = dict(os.environ, PATH=os.path.dirname(ghostfs) + ":" + os.environ.get("PATH", ""))
    mount_and_read(t, "mount.fuse3 -t fuse.ghostfs",
                   ["mount.fuse3", "ghost", mnt, "-t", "fuse.ghostfs", "-o",
                    f"cache={work}/cache-helper," + options], mnt, sums, env)
    # mount(8) with an fstab line; the build's ghostfs named by path (type fuse, PATH#SOURCE).
    mnt = os.path.join(work, "mnt-fstab")
    os.makedirs(mnt)
    fstab = os.path.join(work, "fstab")
    with open(fstab, "w") as f:
        f.write(f"{ghostfs}#ghost {mnt} fuse cache={work}/cache-fstab,{options} 0 0\n")
    mount_and_read(t, "fstab line (mount -T FSTAB)", ["mount", "-T", fstab, mnt], mnt, sums)


def socket_activation_test(t, build, work, nginx, sums):
    mnt = os.path.join(work, "mnt-proxy")
    os.makedirs(mnt)
    ctl = os.path.join(work, "control.sock")
    fs = h.Ghostfs(mnt, os.path.join(work, "cache-proxy"), {"www": nginx.url()}, control=ctl)
    if not fs.start():
        t.check(False, "ghostproxy serves through a socket passed as fd 3 (LISTEN_FDS=1)",
                fs.output())
        return
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    # --listen names a port held by another socket: binding it would fail, so a served
    # request proves the inherited socket is used.
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    exe = os.path.join(build, "proxy", "ghostproxy")
    env = dict(os.environ, LISTEN_FDS="1")
    proxy = subprocess.Popen(
        ["sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"', exe,
         "--listen", f"127.0.0.1:{blocker.getsockname()[1]}", "--mount", mnt, "--control", ctl],
        env=env, close_fds=False, preexec_fn=lambda: os.dup2(listener.fileno(), 3),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    h.on_exit(lambda: proxy.poll() is None and proxy.kill())
    listener.close()  # the proxy holds it now
    body = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
            c.sendall(f"GET {nginx.url()}dir1/a.txt HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Connection: close\r\n\r\n".encode())
            while True:
                b = c.recv(65536)
                if not b:
                    break
                body += b
    except OSError as e:
        body = str(e).encode()
    head, _, payload = body.partition(b"\r\n\r\n")
    served = head.startswith(b"HTTP/1.1 200") and hashlib.sha256(payload).hexdigest() == sums["dir1/a.txt"]
    proxy.terminate()
    try:
        out, _ = proxy.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proxy.kill()
        out, _ = proxy.communicate()
    t.check(served, "ghostproxy serves through a socket passed as fd 3 (LISTEN_FDS=1)",
            head.decode(errors="replace") + "\n" + out)
    blocker.close()
    fs.stop()


def main():
    build = os.path.abspath(h.build_dir())
    t = h.Tap(PLANNED)
    work = h.tempdir("ghost-install-")
    package_tests(t, build, work)
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        t.skip_rest(PLANNED, "needs root and /dev/fuse to mount")
        t.done()
    nginx = h.Nginx(os.path.join(work, "origin"))
    os.makedirs(os.path.join(work, "origin"))
    sums = h.make_tree(os.path.join(work, "origin"))
    if not nginx.start():
        t.skip_rest(PLANNED, "nginx is not installed or did not start")
        t.done()
    fstab_mount_tests(t, build, work, nginx, sums)
    socket_activation_test(t, build, work, nginx, sums)
    t.done()


if __name__ == "__main__":
    main()
