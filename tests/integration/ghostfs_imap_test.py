#!/usr/bin/env python3
"""ghostfs with an IMAP origin against a real dovecot on loopback (DESIGN §4.4): the mount is a
Maildir that Python's mailbox.Maildir reads; bodies are byte-identical to the server's copy
and cached; renames, adds and deletes become deferred IMAP operations that reach the server,
survive a kill -9, and new mail is pushed (IDLE). Skipped without root, /dev/fuse or dovecot."""
import imaplib
import json
import mailbox
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import wait_for  # noqa: E402

PLANNED = 16


def message(subject, size, seed):
    rng = random.Random(seed)
    head = (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n"
            f"Message-ID: <{subject}@ghost.test>\r\nDate: Mon, 1 Jan 2024 10:00:00 +0000\r\n\r\n")
    lines = []
    total = len(head)
    while total < size:
        line = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 ") for _ in range(76)) + "\r\n"
        lines.append(line)
        total += len(line)
    return (head + "".join(lines)).encode()


def imap(dc):
    c = imaplib.IMAP4("127.0.0.1", dc.port)
    c.login(dc.user, dc.password)
    return c


def server_messages(dc, mailbox_name="INBOX"):
    """{subject: (uid, flags, body)} as the server has them."""
    c = imap(dc)
    c.select(mailbox_name, readonly=True)
    typ, data = c.uid("SEARCH", None, "ALL")
    out = {}
    for uid in data[0].split():
        typ, d = c.uid("FETCH", uid, "(FLAGS BODY.PEEK[])")
        body = d[0][1]
        flags = imaplib.ParseFlags(d[0][0])
        subject = [ln for ln in body.split(b"\r\n") if ln.startswith(b"Subject: ")][0][9:].decode()
        out[subject] = (int(uid), [f.decode() for f in flags], body)
    c.logout()
    return out


def stats(control):
    exe = os.path.join(harness.build_dir(), "fs", "ghostctl")
    out = subprocess.run([exe, "--control", control, "--json", "stats"], capture_output=True, text=True, timeout=10)
    return json.loads(out.stdout)


def main():
    harness.require_root_and_fuse()
    dc = harness.started_dovecot()
    t = harness.Tap(PLANNED)
    sizes = {"small": 3 * 1024, "medium": 200 * 1024, "large": 3 * 1024 * 1024}
    sent = {}
    for i, (subject, size) in enumerate(sizes.items()):
        sent[subject] = message(subject, size, i)
        dc.seed("", sent[subject], info="S" if subject == "small" else "")
    dc.seed(".Work", message("work1", 5000, 9))
    c = imap(dc)
    c.create("Entw&APw-rfe")  # "Entwürfe" in modified UTF-7
    c.create("odd.dots")
    c.logout()

    work = harness.tempdir()
    mnt = os.path.join(work, "mnt")
    cache = os.path.join(work, "cache")
    control = os.path.join(work, "control.sock")
    os.makedirs(mnt)
    pwfile = dc.password_file()
    fs = harness.Ghostfs(mnt, cache, {"mail": dc.url()}, args=["--password-file", f"mail={pwfile}"], control=control)
    if not t.check(fs.start(), "ghostfs mounts with an imap:// origin", fs.output()):
        t.skip_rest(PLANNED, "no mount")
        t.done()
    md_path = os.path.join(mnt, "mail")
    try:
        md = mailbox.Maildir(md_path, factory=None, create=False)
        keys = md.keys()
        subjects = sorted(md[k]["Subject"] for k in keys)
        t.check(subjects == sorted(sizes), "mailbox.Maildir lists INBOX", subjects)
    except Exception as e:
        t.check(False, "mailbox.Maildir lists INBOX", f"{e}\n{fs.output()}")
    folders = sorted(md.list_folders()) if os.path.isdir(md_path) else []
    # dovecot's Maildir++ store uses '.' as its hierarchy delimiter: "odd.dots" is "dots" inside
    # "odd", which is the Maildir++ folder ".odd.dots".
    t.check(folders == ["Entwürfe", "Work", "odd", "odd.dots"],
            "folders map to Maildir++ names (modified UTF-7 as UTF-8, hierarchy as dots)", folders)

    # Unseen mail is in new/ (readers show it as new); moved to cur/ unread as mutt does.
    unseen_in_new = sorted(n.split(":2,")[0] for n in harness.mark_old(md_path))
    server = server_messages(dc)
    identical = True
    detail = ""
    names = {}
    for name in os.listdir(os.path.join(md_path, "cur")):
        with open(os.path.join(md_path, "cur", name), "rb") as f:
            body = f.read()
        st = os.stat(os.path.join(md_path, "cur", name))
        subject = [ln for ln in body.split(b"\r\n") if ln.startswith(b"Subject: ")][0][9:].decode()
        names[subject] = name
        if body != server[subject][2] or st.st_size != len(body):
            identical = False
            detail += f"{subject}: {len(body)} bytes vs server {len(server[subject][2])}, stat {st.st_size}\n"
    t.check(identical and len(names) == 3, "every message reads byte-identical to the server's copy", detail or names)
    t.check(names.get("small", "").endswith(":2,S") and
            unseen_in_new == sorted(n.split(":2,")[0] for s_, n in names.items() if s_ != "small"),
            "the info suffix carries \\Seen; the unseen messages were in new/", f"{names} {unseen_in_new}")

    large = os.path.join(md_path, "cur", names.get("large", "x"))
    cached = wait_for(lambda: os.getxattr(large, "user.ghost.cached") == b"1", 10)
    with open(large, "rb") as f:
        again = f.read()
    src = os.getxattr(large, "user.ghost.source").decode() if cached else "?"
    t.check(cached and again == server["large"][2] and src == "disk",
            "a read body is cached and the next open reads it from the disk", f"cached={cached} source={src}")

    # Flags: set \Flagged and \Seen by renaming.
    medium = names.get("medium", "")
    new_name = medium.split(":2,")[0] + ":2,FS"
    os.rename(os.path.join(md_path, "cur", medium), os.path.join(md_path, "cur", new_name))
    t.check(os.path.exists(os.path.join(md_path, "cur", new_name)), "a flag rename shows at once")
    flags = wait_for(lambda: set(server_messages(dc)["medium"][1]) >= {"\\Flagged", "\\Seen"})
    t.check(flags, "the flags reach the server (UID STORE)", server_messages(dc)["medium"][1])

    # A message written into the Maildir (tmp/ then new/, as mailbox.Maildir.add does).
    added = message("added", 40000, 42)
    md = mailbox.Maildir(md_path, factory=None, create=False)
    try:
        md.add(added)
        ok_add = True
    except Exception as e:
        ok_add = False
        print(f"# add: {e}")
    on_server = wait_for(lambda: "added" in server_messages(dc))
    t.check(ok_add and on_server and server_messages(dc)["added"][2] == added,
            "a message added to new/ is APPENDed byte-identical", fs.output()[-2000:])

    # Deletion expunges from INBOX (by the default imap_delete, a UID MOVE to Trash; the
    # expunge modes are in ghostfs_imap_sync_test.py).
    small = names.get("small", "")
    os.unlink(os.path.join(md_path, "cur", small))
    gone = wait_for(lambda: "small" not in server_messages(dc))
    t.check(gone and not os.path.exists(os.path.join(md_path, "cur", small)) and "small" in server_messages(dc, "Trash"),
            "unlink removes the message from INBOX on the server (moved to Trash)")

    # New mail is pushed (IDLE): no listing refresh would find it before the freshness runs out.
    os.listdir(os.path.join(md_path, "cur"))
    dc.seed("", message("pushed", 2000, 77), into_new=True)
    appeared = wait_for(lambda: any("pushed" in open(os.path.join(md_path, "new", n), "rb").read(400).decode(errors="replace")
                                    for n in os.listdir(os.path.join(md_path, "new"))), 15)
    t.check(appeared, "new mail delivered to the server appears in the view (IDLE)")

    s = stats(control)
    imap_stats = s.get("imap") or {}
    t.check(imap_stats.get("sent", 0) >= 3 and imap_stats.get("queued") == 0,
            "ghostctl stats shows IMAP operations sent and queued", imap_stats)

    # Crash with queued operations: the server goes away, changes queue, ghostfs is killed.
    listing = os.listdir(os.path.join(md_path, "cur"))
    dc.stop()
    target = [n for n in listing if n.endswith(":2,")][:1]
    if target:
        os.rename(os.path.join(md_path, "cur", target[0]),
                  os.path.join(md_path, "cur", target[0].split(":2,")[0] + ":2,RS"))
    queued = (stats(control).get("imap") or {}).get("queued", 0)
    t.check(queued >= 1, "with the server down the change stays queued", stats(control).get("imap"))
    fs.kill9()
    dc.start()
    fs2 = harness.Ghostfs(mnt, cache, {"mail": dc.url()}, args=["--password-file", f"mail={pwfile}"], control=control)
    t.check(fs2.start(), "ghostfs mounts again after kill -9", fs2.output())
    os.listdir(md_path)  # the mount is up; replay started at mount
    replayed = wait_for(lambda: any({"\\Answered", "\\Seen"} <= set(v[1]) for v in server_messages(dc).values()), 15)
    t.check(replayed, "the queued flag change is replayed after the crash", fs2.output()[-2000:])
    fs2.stop()

    # Bad input: a wrong password gives a clear errno, a log line, and the mount stays up.
    with open(pwfile, "w") as f:
        f.write("wrong\n")
    cache2 = os.path.join(work, "cache2")
    fs3 = harness.Ghostfs(mnt, cache2, {"mail": dc.url()}, args=["--password-file", f"mail={pwfile}"])
    fs3.start()
    err = None
    try:
        os.listdir(os.path.join(md_path, "cur"))
    except OSError as e:
        err = e.errno
    t.check(err is not None and os.path.ismount(mnt) and "mail" in os.listdir(mnt) and "log in" in fs3.output(),
            "a refused login is an errno to the reader and a log line; the mount stays up",
            f"errno={err}\n{fs3.output()[-1000:]}")
    fs3.stop()
    t.done()


if __name__ == "__main__":
    main()
