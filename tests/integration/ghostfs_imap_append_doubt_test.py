#!/usr/bin/env python3
"""A delivery whose APPEND reached the server but whose answer was lost is not appended twice
(common/imap/find_appended.h). ghostfs_mail_random found duplicates after a SIGKILL landed
between dovecot's OK and the journal's ack (5 of 18 loaded runs). Here the lost answer is made
on purpose: the server is stopped, a message is delivered into the Maildir view (its APPEND is
journaled and queued), ghostfs is killed, and the same bytes with the same INTERNALDATE are
APPENDed to the server by hand, as the lost try would have. After the remount the server must
hold one copy, not two; a message the server does not have is still appended once. Five
rounds: with a Message-ID, without one (found by INTERNALDATE), not on the server; moved on
(the lost try's copy is in Archive, where another client moved it before the remount: found
there, not appended again; ghostfs_mail_random found ['Trash', 'Trash'] once under load); and
an older copy elsewhere (the same bytes in Archive with another INTERNALDATE: not taken for the
lost try, the message is appended).
Skipped without root, /dev/fuse or dovecot."""
import imaplib
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLANNED = 9


def message(tag, with_id):
    head = f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {tag}\r\n"
    if with_id:
        head += f"Message-ID: <{tag}@ghost.test>\r\n"
    body = "".join(f"line {i} of {tag}\r\n" for i in range(40))
    return (head + "Date: Mon, 1 Jan 2024 10:00:00 +0000\r\n\r\n" + body).encode()


def copies(dc, data, box="INBOX"):
    c = dc.login()
    c.select(box, readonly=True)
    typ, d = c.uid("SEARCH", None, "ALL")
    n = 0
    for uid in d[0].split():
        typ, f = c.uid("FETCH", uid, "(BODY.PEEK[])")
        if f and isinstance(f[0], tuple) and f[0][1] == data:
            n += 1
    c.logout()
    return n


def imap_stats(ctl):
    exe = os.path.join(h.build_dir(), "fs", "ghostctl")
    out = subprocess.run([exe, "--control", ctl, "--json", "stats"], capture_output=True, text=True, timeout=20)
    return json.loads(out.stdout).get("imap") or {}


def main():
    h.require_root_and_fuse()
    dc = h.started_dovecot()
    t = h.Tap(PLANNED)
    work = h.tempdir()
    mnt, cache, ctl = (os.path.join(work, x) for x in ("mnt", "cache", "ctl.sock"))
    os.makedirs(mnt)
    args = ["--password-file", f"mail={dc.password_file()}"]
    inbox = os.path.join(mnt, "mail")
    c = dc.login()
    c.create("Archive")
    c.logout()
    # (label, with a Message-ID, the lost try's copy: in INBOX, moved on to Archive, none; an
    # older copy with another INTERNALDATE in Archive)
    rounds = [("with-id", True, "INBOX", False), ("no-id", False, "INBOX", False), ("not-there", True, None, False),
              ("moved", True, "Archive", False), ("older-copy", True, None, True)]
    for label, with_id, lost_copy, older_copy in rounds:
        on_server = lost_copy is not None
        fs = h.Ghostfs(mnt, cache, {"mail": dc.url()}, args=args, control=ctl)
        if not fs.start():
            t.check(False, f"{label}: ghostfs mounts", fs.output()[-1500:])
            t.skip_rest(PLANNED, "no mount")
            t.done()
        os.listdir(os.path.join(inbox, "new"))  # the listing is loaded while the server is up
        dc.stop()
        data = message(label, with_id)
        tmp = os.path.join(inbox, "tmp", f"{label}.host")
        with open(tmp, "wb") as f:
            f.write(data)
        dest = os.path.join(inbox, "new", f"{label}.host")
        os.rename(tmp, dest)
        date = int(os.stat(dest).st_mtime)  # the APPEND's INTERNALDATE
        fs.kill9()
        dc.start()
        c = dc.login()
        if on_server:  # what the lost try did (and, for "moved", another client after it)
            typ, _ = c.append(lost_copy, None, imaplib.Time2Internaldate(date), data)
        if older_copy:  # the same bytes, delivered an hour earlier
            typ, _ = c.append("Archive", None, imaplib.Time2Internaldate(date - 3600), data)
        c.logout()
        fs = h.Ghostfs(mnt, cache, {"mail": dc.url()}, args=args, control=ctl)
        if not fs.start():
            t.check(False, f"{label}: ghostfs mounts again", fs.output()[-1500:])
            t.skip_rest(PLANNED, "no mount")
            t.done()
        drained = h.wait_for(lambda: imap_stats(ctl).get("queued") == 0, 30)
        st = imap_stats(ctl)
        n, elsewhere = copies(dc, data), copies(dc, data, "Archive")
        if older_copy:
            t.check(drained and n == 1 and elsewhere == 1 and not st.get("appends_found"),
                    f"{label}: a copy with another INTERNALDATE in another mailbox is not taken for the lost try: "
                    "the message is appended, the copy left alone",
                    f"drained={drained} INBOX={n} Archive={elsewhere} stats={st}\n{fs.output()[-1500:]}")
        else:
            t.check(drained and n + elsewhere == 1,
                    f"{label}: after the replay the server holds the message once"
                    + (" (the APPEND in doubt found in " + lost_copy + ")" if on_server else " (appended)"),
                    f"drained={drained} INBOX={n} Archive={elsewhere} stats={st}\n{fs.output()[-1500:]}")
        if on_server:
            t.check(st.get("appends_found") == 1, f"{label}: ghostctl stats counts it (imap.appends_found)", st)
        fs.stop()
    probs = h.index_problems(cache)
    t.check(not probs, "the index passes integrity_check", probs)
    t.done()


if __name__ == "__main__":
    main()
