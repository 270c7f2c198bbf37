#!/usr/bin/env python3
"""A mailbox deleted on the server by another client leaves ghostfs's Maildir view within the
listings' freshness (1 s here, plus the kernel's 1 s name cache): gone from mail/'s listing,
ENOENT at lookup, and its cur/ no longer lists the old messages (fs/mail_tree.cc, MailBox::gone;
before it, the last listing stayed for the life of the mount). Made again with the same name
(a new UIDVALIDITY), the folder shows the new mailbox's messages, none of the old. Changes
queued for a mailbox that is then deleted (a flag change and a delivered message, queued while
the server was down) are not lost silently: each is recorded in the unapplied file, the
delivered message byte for byte, and the log says the mailbox was deleted.
Skipped without root, /dev/fuse or dovecot."""
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402
from harness import wait_for  # noqa: E402

PLANNED = 10


def message(tag):
    return (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {tag}\r\n"
            f"Message-ID: <{tag}@ghost.test>\r\n\r\nbody of {tag}\r\n").encode()


def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as e:
        return e.errno


def subjects(cur):
    out = []
    for name in listing(cur) if isinstance(listing(cur), list) else []:
        try:
            with open(os.path.join(cur, name), "rb") as f:
                out.append(f.read().split(b"Subject: ")[1].split(b"\r\n")[0].decode())
        except (OSError, IndexError):
            out.append("?")
    return sorted(out)


def main():
    h.require_root_and_fuse()
    dc = h.started_dovecot()
    # Seen, so they show in cur/ (unseen ones show in new/).
    dc.seed(".Work", message("old1"), info="S")
    dc.seed(".Work", message("old2"), info="S")
    dc.seed(".Keep", message("kept"), info="S")
    t = h.Tap(PLANNED)
    work = h.tempdir()
    conf = os.path.join(work, "ghostfs.toml")
    with open(conf, "w") as f:
        f.write("heuristic_freshness = 1\n")
    fs, mnt, ctl = h.mount_origin(t, PLANNED, work, {"mail": dc.url()}, check="ghostfs mounts the IMAP origin",
                                  args=["--password-file", f"mail={dc.password_file()}", "--config", conf])
    mail = os.path.join(mnt, "mail")
    work_cur = os.path.join(mail, ".Work", "cur")
    before = (listing(mail), subjects(work_cur))

    # Deleted by another client.
    c = dc.login()
    typ, said = c.delete("Work")
    c.logout()
    t0 = time.monotonic()
    gone = wait_for(lambda: ".Work" not in listing(mail) and not os.path.exists(os.path.join(mail, ".Work")), 10)
    took = time.monotonic() - t0
    t.check(".Work" in before[0] and before[1] == ["old1", "old2"] and typ == "OK" and gone,
            "a mailbox deleted by another client leaves mail/'s listing and lookups give ENOENT "
            f"(after {took:.1f} s)", (before, typ, said, listing(mail), fs.output()[-1500:]))
    t.check(listing(work_cur) == 2 and ".Keep" in listing(mail) and subjects(os.path.join(mail, ".Keep", "cur")) == ["kept"],
            "its cur/ is ENOENT, not the last listing; the other folder stays",
            (listing(work_cur), listing(mail)))

    # Made again with the same name: a new UIDVALIDITY, a new message; none of the old.
    c = dc.login()
    c.create("Work")
    c.append("Work", "(\\Seen)", None, message("new1"))
    c.select("Work", readonly=True)
    uidvalidity = c.response("UIDVALIDITY")[1][0].decode()
    c.logout()
    back = wait_for(lambda: ".Work" in listing(mail) and subjects(work_cur) == ["new1"], 10)
    names = listing(work_cur)
    t.check(back and isinstance(names, list) and all(n.startswith(uidvalidity + ".") for n in names),
            "made again with the same name, the folder shows the new mailbox (its UIDVALIDITY), none of the old",
            (listing(mail), names, subjects(work_cur), uidvalidity))

    # Changes queued while the server is down, for a mailbox deleted meanwhile.
    os.listdir(work_cur)
    dc.stop()
    [new1] = listing(work_cur)
    os.rename(os.path.join(work_cur, new1), os.path.join(work_cur, new1.split(":2,")[0] + ":2,F"))
    delivered = message("delivered")
    tmp = os.path.join(mail, ".Work", "tmp", "delivered.host")
    with open(tmp, "wb") as f:
        f.write(delivered)
    os.rename(tmp, os.path.join(mail, ".Work", "new", "delivered.host"))
    queued = h.ghostctl_json(ctl, "stats").get("imap", {}).get("queued")
    t.check(queued == 2, "a flag change and a delivery into the folder are queued while the server is down",
            queued)
    shutil.rmtree(os.path.join(dc.maildir, ".Work"))  # what a DELETE does to dovecot's Maildir
    if not dc.start():
        t.check(False, "dovecot starts again", dc.log()[-500:])
        t.skip_rest(PLANNED, "no dovecot")
        t.done()
    r = h.ghostctl(ctl, "--json", "sync")
    try:
        synced = json.loads(r.stdout)
    except ValueError:
        synced = {}
    stats = h.ghostctl_json(ctl, "stats").get("imap", {})
    t.check(synced.get("left") == 0 and stats.get("queued") == 0,
            "ghostctl sync: nothing stays queued for the deleted mailbox", (r.stdout, r.stderr, stats))
    records = []
    try:
        with open(stats.get("unapplied_file", "")) as f:
            records = [json.loads(line) for line in f if line.strip()]
    except OSError:
        pass
    kinds = sorted(r["op"] for r in records if r.get("mailbox") == "Work")
    t.check(len(kinds) == 2 and all("Mailbox doesn't exist" in r["why"] or "NONEXISTENT" in r["why"]
                                    or "TRYCREATE" in r["why"] for r in records),
            "both are recorded in the unapplied file with the server's reason", records)
    kept = [r for r in records if r.get("message_file")]
    body = b""
    if kept:
        with open(kept[0]["message_file"], "rb") as f:
            body = f.read()
    t.check(body == delivered, "the delivered message is kept byte for byte beside the record", (kept, body[:200]))
    t.check("deleted on the server" in fs.output() and "Work" not in [m.decode().split(' "')[-1].strip('"')
                                                                     for m in server_list(dc)],
            "the log says the mailbox was deleted; nothing made it again on the server",
            (fs.output()[-2000:], server_list(dc)))
    wait_for(lambda: ".Work" not in listing(mail), 10)
    t.check(".Work" not in listing(mail), "the folder is gone from the view again", listing(mail))
    fs.stop()
    t.done()


def server_list(dc):
    c = dc.login()
    try:
        return c.list()[1]
    finally:
        c.logout()


if __name__ == "__main__":
    main()
