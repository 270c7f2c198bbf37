#!/usr/bin/env python3
"""local/ is a real POSIX tree (fs/local_tree.h): inodes keep their identity across rename and
unlink, renameat2 flags, symlinks, hard links, mknod/mkfifo, user xattrs, the caller's
ownership and mode, ENAMETOOLONG, O_RDONLY|O_TRUNC as on tmpfs, and errors reach the writer
(a full cache disk fails the write, `cp` exits non-zero). Every check runs twice: without a
profile (writes go to the disk at once) and with --profile ipaq-2004 (writes wait in the
write queue while the emulated disk sleeps). The cache is a 24 MiB tmpfs. TAP; skipped
without root or /dev/fuse."""
import ctypes
import errno
import os
import resource
import shutil
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
CHECKS = 18  # per mode
MODES = (("plain", []), ("profile", ["--profile", "ipaq-2004", "--knob", "50"]))
PLAN = len(MODES) * (CHECKS + 1)
_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old, new, flags):
    """Returns 0 or the errno."""
    r = _libc.renameat2(-100, old.encode(), -100, new.encode(), flags)
    return 0 if r == 0 else ctypes.get_errno()


def err_of(fn):
    try:
        fn()
        return 0
    except OSError as e:
        return e.errno


def as_user(uid, gid, fn):
    """Runs fn() in a child with (uid, gid) and umask 0; returns its exit status."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            fn()
            os._exit(0)
        except BaseException:  # noqa: BLE001 - the child reports by its status
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


class Run:
    def __init__(self, t, label, fs, ctl, local):
        self.t, self.label, self.fs, self.ctl, self.local = t, label, fs, ctl, local

    def check(self, ok, name, detail=""):
        return self.t.check(ok, f"[{self.label}] {name}", detail)

    def p(self, *names):
        return os.path.join(self.local, *names)

    def disk_sleeps(self):
        """With a profile: waits until the emulated disk is in standby, so writes are queued."""
        if self.ctl is None:
            return True
        c = h.Control(self.ctl)
        return h.wait_for(lambda: [d for d in c.ok("devices") if d["kind"] == "disk"][0]["mode"] == "standby", 20)

    def queued_bytes(self):
        if self.ctl is None:
            return 0
        return h.Control(self.ctl).ok("stats")["write_queue"]["queued_bytes"]


def check_identity(r):
    # An open file that is unlinked stays readable and writable until it is closed.
    fd = os.open(r.p("unlinked"), os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, b"x" * 20)
    os.unlink(r.p("unlinked"))
    got = (os.pread(fd, 100, 0), os.fstat(fd).st_size)
    os.pwrite(fd, b"tail", 20)
    sync = err_of(lambda: os.fsync(fd))
    back = os.pread(fd, 100, 0)
    os.close(fd)
    r.check(got == (b"x" * 20, 20) and sync == 0 and back == b"x" * 20 + b"tail",
            "open_unlinked_file_stays_readable_and_writable", (got, sync, back))

    # After unlink and a mkdir of the same name, the old fd still works on its file.
    fd = os.open(r.p("reused"), os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, b"old file")
    os.unlink(r.p("reused"))
    os.mkdir(r.p("reused"))
    got = err_of(lambda: os.pread(fd, 100, 0)), os.pread(fd, 100, 0), os.fstat(fd).st_size
    os.close(fd)
    os.rmdir(r.p("reused"))
    r.check(got == (0, b"old file", 8), "fd_survives_unlink_and_mkdir_of_same_name", got)

    # An fd whose name is renamed over keeps its own file's size and data.
    fd = os.open(r.p("victim"), os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, b"twenty bytes of data")
    with open(r.p("newer"), "wb") as f:
        f.write(b"ten bytes!")
    os.rename(r.p("newer"), r.p("victim"))
    got = (os.fstat(fd).st_size, os.pread(fd, 100, 0))
    os.close(fd)
    with open(r.p("victim"), "rb") as f:
        named = f.read()
    os.unlink(r.p("victim"))
    r.check(got == (20, b"twenty bytes of data") and named == b"ten bytes!", "renamed_over_fd_keeps_its_own_file",
            (got, named))


def check_renameat2(r):
    a, b = r.p("ex_a"), r.p("ex_b")
    # 60,000 fsync'd bytes in a, 10 in b; exchanged while b's writes are still queued.
    with open(a, "wb") as f:
        f.write(b"A" * 60000)
        f.flush()
        os.fsync(f.fileno())
    r.disk_sleeps()
    fb = os.open(b, os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fb, b"B" * 10)
    rc = renameat2(a, b, RENAME_EXCHANGE)
    os.pwrite(fb, b"b", 0)  # lands in its own file, now named a
    os.fsync(fb)
    os.close(fb)
    with open(a, "rb") as f:
        ga = f.read()
    with open(b, "rb") as f:
        gb = f.read()
    r.check(rc == 0 and ga == b"b" + b"B" * 9 and gb == b"A" * 60000,
            "rename_exchange_swaps_files_and_writes_follow_their_file", (rc, ga[:20], len(gb)))
    # RENAME_NOREPLACE refuses an existing target and leaves both alone.
    rc = renameat2(a, b, RENAME_NOREPLACE)
    with open(b, "rb") as f:
        still = f.read() == b"A" * 60000
    rc2 = renameat2(a, r.p("ex_c"), RENAME_NOREPLACE)
    r.check(rc == errno.EEXIST and still and rc2 == 0 and os.path.exists(r.p("ex_c")) and not os.path.exists(a),
            "rename_noreplace_refuses_an_existing_name", (rc, rc2))


def check_links(r):
    with open(r.p("target"), "wb") as f:
        f.write(b"through the link")
    os.symlink("target", r.p("sym"))
    with open(r.p("sym"), "rb") as f:
        via = f.read()
    r.check(os.readlink(r.p("sym")) == "target" and via == b"through the link" and os.path.islink(r.p("sym")),
            "symlink_and_readlink", (os.readlink(r.p("sym")), via))
    os.link(r.p("target"), r.p("hard"))
    st1, st2 = os.stat(r.p("target")), os.stat(r.p("hard"))
    with open(r.p("hard"), "r+b") as f:
        f.write(b"T")
    with open(r.p("target"), "rb") as f:
        seen = f.read()
    os.unlink(r.p("target"))
    nlink = os.stat(r.p("hard")).st_nlink
    r.check(st1.st_ino == st2.st_ino and st2.st_nlink == 2 and seen == b"Through the link" and nlink == 1,
            "hard_link_shares_the_file", (st1.st_ino, st2.st_ino, st2.st_nlink, seen, nlink))
    os.mkfifo(r.p("fifo"), 0o640)
    os.mknod(r.p("node"), 0o600 | 0o100000)
    r.check(oct(os.lstat(r.p("fifo")).st_mode) == oct(0o10640) and oct(os.lstat(r.p("node")).st_mode) == oct(0o100600),
            "mknod_and_mkfifo", (oct(os.lstat(r.p("fifo")).st_mode), oct(os.lstat(r.p("node")).st_mode)))


def check_xattrs(r):
    p = r.p("attrs")
    with open(p, "wb") as f:
        f.write(b"x")
    os.setxattr(p, "user.colour", b"blue")
    os.setxattr(p, "user.size", b"7")
    got = (os.getxattr(p, "user.colour"), sorted(os.listxattr(p)))
    os.removexattr(p, "user.colour")
    gone = err_of(lambda: os.getxattr(p, "user.colour"))
    create_twice = err_of(lambda: os.setxattr(p, "user.size", b"8", os.XATTR_CREATE))
    r.check(got == (b"blue", ["user.colour", "user.size"]) and gone == errno.ENODATA and create_twice == errno.EEXIST
            and os.listxattr(p) == ["user.size"], "user_xattrs_set_get_list_remove", (got, gone, create_twice))


def check_owner_and_mode(r):
    os.mkdir(r.p("shared"), 0o777)
    os.chmod(r.p("shared"), 0o777)

    def work():
        os.umask(0)
        os.mkdir(r.p("shared", "by_nobody"), 0o777)
        with open(r.p("shared", "file_by_nobody"), "w") as f:
            f.write("mine")
    status = as_user(65534, 65534, work)
    try:
        st = os.stat(r.p("shared", "file_by_nobody"))
        dst = os.stat(r.p("shared", "by_nobody"))
        owners = (st.st_uid, st.st_gid, dst.st_uid, dst.st_gid)
    except OSError as e:
        owners = e
    r.check(status == 0 and owners == (65534, 65534, 65534, 65534), "file_created_by_uid_65534_is_owned_by_it",
            (status, owners))
    old = os.umask(0)
    try:
        os.mkdir(r.p("open_dir"), 0o777)
        fd = os.open(r.p("open_file"), os.O_CREAT | os.O_WRONLY, 0o666)
        os.close(fd)
    finally:
        os.umask(old)
    modes = (oct(os.stat(r.p("open_dir")).st_mode & 0o7777), oct(os.stat(r.p("open_file")).st_mode & 0o7777))
    os.umask(0o027)
    try:
        os.mkdir(r.p("masked_dir"), 0o777)
    finally:
        os.umask(old)
    masked = oct(os.stat(r.p("masked_dir")).st_mode & 0o7777)
    r.check(modes == ("0o777", "0o666") and masked == "0o750", "mkdir_0777_with_umask_0_gives_0777_once_masked",
            (modes, masked))


def check_names(r):
    long_name = "n" * 256
    errs = (err_of(lambda: os.stat(r.p(long_name))), err_of(lambda: open(r.p(long_name), "w")),
            err_of(lambda: os.mkdir(r.p(long_name))), err_of(lambda: os.symlink("x", r.p("n" * 1024))))
    ok255 = err_of(lambda: open(r.p("m" * 255), "w").close())
    r.check(errs == (errno.ENAMETOOLONG,) * 4 and ok255 == 0, "names_over_255_bytes_get_ENAMETOOLONG", (errs, ok255))


def check_trunc(r, plain_dir):
    # O_RDONLY|O_TRUNC does what it does on a plain directory (Linux truncates when the caller
    # may write the file), and a running binary is never truncated (ETXTBSY).
    for d in (r.local, plain_dir):
        with open(os.path.join(d, "trunc_me"), "wb") as f:
            f.write(b"content")
    results = []
    for d in (r.local, plain_dir):
        e = err_of(lambda: os.close(os.open(os.path.join(d, "trunc_me"), os.O_RDONLY | os.O_TRUNC)))
        results.append((e, os.stat(os.path.join(d, "trunc_me")).st_size))
    r.check(results[0] == results[1], "open_rdonly_trunc_matches_a_plain_directory", results)
    binary = r.p("running_sleep")
    shutil.copy("/bin/sleep", binary)
    size = os.stat(binary).st_size
    proc = subprocess.Popen([binary, "5"])
    time.sleep(0.5)
    e = err_of(lambda: os.open(binary, os.O_RDONLY | os.O_TRUNC))
    still = os.stat(binary).st_size
    proc.kill()
    rc = proc.wait()
    r.check(e == errno.ETXTBSY and still == size and rc == -9, "open_trunc_of_a_running_binary_is_ETXTBSY_not_SIGBUS",
            (e, still, size, rc))


def check_errors(r):
    # A write that fails (here: past a file-size limit put on the daemon) reaches its writer,
    # once; another process's open and close neither see nor consume it. Without a profile the
    # limit is there before the write, whose reservation fails it at once (or its fsync); with
    # one, the limit comes after the write was acknowledged and queued, and the writer's
    # fsync reports the deferred failure.
    r.disk_sleeps()
    p = r.p("limited")
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    pid = r.fs.proc.pid
    limit = lambda: resource.prlimit(pid, resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))  # noqa: E731
    try:
        if not r.ctl:
            limit()
        wrote = err_of(lambda: os.pwrite(fd, b"x" * 4096, 2 << 20))
        if r.ctl:
            limit()
            h.Control(r.ctl).ok("flush")  # the queued write meets the limit
        other = err_of(lambda: os.close(os.open(p, os.O_RDONLY)))
        first, second = err_of(lambda: os.fsync(fd)), err_of(lambda: os.fsync(fd))
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    os.close(fd)
    os.unlink(p)
    told = (wrote, first) in ((errno.EFBIG, 0), (0, errno.EFBIG)) if not r.ctl else (wrote, first) == (0, errno.EFBIG)
    r.check(told and other == 0 and second == 0 and r.fs.proc.poll() is None,
            "a_failed_write_reaches_its_writer_once_not_another_opener", (wrote, other, first, second))
    # Writes to an open unlinked file are not lost while the disk sleeps.
    r.disk_sleeps()
    fd = os.open(r.p("gone_but_open"), os.O_CREAT | os.O_RDWR, 0o644)
    os.unlink(r.p("gone_but_open"))
    os.write(fd, b"q" * 100000)
    queued = r.queued_bytes()
    sync = err_of(lambda: os.fsync(fd))
    back = os.pread(fd, 200000, 0)
    os.close(fd)
    r.check(sync == 0 and back == b"q" * 100000 and "lost its file" not in r.fs.output(),
            "writes_to_an_open_unlinked_file_are_not_lost", (sync, len(back), queued))
    # A full cache disk is reported to the writer: cp of 30 MiB onto the 24 MiB disk fails.
    src = os.path.join(h.tempdir(), "30MiB")
    with open(src, "wb") as f:
        f.write(os.urandom(30 << 20))
    r.disk_sleeps()
    cp = subprocess.run(["cp", src, r.p("too_big")], capture_output=True, text=True, timeout=120)
    r.check(cp.returncode != 0 and "No space" in cp.stderr, "cp_of_30MiB_onto_a_24MiB_cache_disk_fails",
            (cp.returncode, cp.stderr))
    # Another process's open and close neither see nor consume the writer's error, and the
    # space comes back once the file is gone.
    os.unlink(r.p("too_big"))
    # (Blocks come back once the last write of the file in flight on the emulated disk ends.)
    h.wait_for(lambda: os.statvfs(r.local).f_bavail * os.statvfs(r.local).f_frsize > (4 << 20), 30)
    fd = os.open(r.p("after_full"), os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, b"z" * (1 << 20))
    r.check(err_of(lambda: os.fsync(fd)) == 0 and os.pread(fd, 10, 0) == b"z" * 10,
            "after_a_full_disk_writes_work_again", r.fs.output()[-400:])
    os.close(fd)


def main():
    h.require_root_and_fuse()
    t = h.Tap(PLAN)
    work = h.tempdir()
    os.chmod(work, 0o755)  # uid 65534 reaches the mount through it
    for label, args in MODES:
        disk = os.path.join(work, f"disk-{label}")
        os.makedirs(disk)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", disk]).returncode != 0:
            t.skip_rest(PLAN, "cannot mount a tmpfs")
            t.done()
        h.on_exit(lambda d=disk: subprocess.run(["umount", "-l", d]))
        mnt = os.path.join(work, f"mnt-{label}")
        os.makedirs(mnt)
        ctl = os.path.join(work, f"ctl-{label}.sock") if args else None
        fs = h.Ghostfs(mnt, os.path.join(disk, "cache"), {}, args=["-o", "allow_other", *args], control=ctl)
        if not t.check(fs.start(), f"[{label}] mounts with its cache on a 24 MiB tmpfs", fs.output()):
            t.skip_rest(t.n + CHECKS, "not mounted")
            continue
        plain = h.tempdir()
        r = Run(t, label, fs, ctl, os.path.join(mnt, "local"))
        steps = ((check_identity, 3), (check_renameat2, 2), (check_links, 3), (check_xattrs, 1),
                 (check_owner_and_mode, 2), (check_names, 1), (lambda r: check_trunc(r, plain), 2),
                 (check_errors, 4))
        assert sum(n for _, n in steps) == CHECKS
        for step, count in steps:
            before = t.n
            try:
                step(r)
            except Exception as e:  # noqa: BLE001 - a crash fails the step's checks, the run goes on
                while t.n < before + count:
                    r.check(False, f"{getattr(step, '__name__', 'step')} raised", traceback.format_exc())
        fs.stop()
    t.done()


if __name__ == "__main__":
    main()
