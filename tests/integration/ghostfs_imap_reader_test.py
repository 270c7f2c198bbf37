#!/usr/bin/env python3
"""Mail the reader's way against a real dovecot: unseen messages show in new/
(seen ones in cur/), a reader's move from new/ to cur/ sticks; with the card saving power
(--profile ipaq-2004, K=50) a change waits in the queue until `ghostctl sync` sends it, and
`ghostctl flush` sends it too; with the server down, sync says what it left (exit 1) and the
unmount logs what stays queued; a wrong password is tried a few times a minute, not at every
access, while the cached messages stay readable. TAP; skipped without root, /dev/fuse or
dovecot."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import wait_for  # noqa: E402

PLANNED = 11


def message(subject, mid):
    return (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n"
            f"Message-ID: <{mid}@ghost.test>\r\n\r\nbody of {subject}\r\n").encode()


def imap_stats(ctl):
    out = harness.ghostctl(ctl, "--json", "stats", timeout=60)
    try:
        return json.loads(out.stdout).get("imap") or {}
    except json.JSONDecodeError:
        return {}


def flagged_on_server(dc):
    import imaplib
    c = imaplib.IMAP4("127.0.0.1", dc.port)
    c.login(dc.user, dc.password)
    c.select("INBOX", readonly=True)
    typ, d = c.uid("SEARCH", None, "FLAGGED")
    c.logout()
    return len(d[0].split())


def main():
    harness.require_root_and_fuse()
    dc = harness.started_dovecot()
    t = harness.Tap(PLANNED)
    dc.seed("", message("unseen one", "u1"))
    dc.seed("", message("unseen two", "u2"))
    dc.seed("", message("already read", "r1"), info="S")
    work = harness.tempdir()
    mnt, cache, ctl = os.path.join(work, "mnt"), os.path.join(work, "cache"), os.path.join(work, "ctl.sock")
    os.makedirs(mnt)
    pw = dc.password_file()
    fs = harness.Ghostfs(mnt, cache, {"mail": dc.url()},
                         args=["--password-file", f"mail={pw}", "--profile", "ipaq-2004", "--knob", "50"],
                         control=ctl)
    if not t.check(fs.start(), "ghostfs mounts the dovecot origin", fs.output()):
        t.skip_rest(PLANNED, "no mount")
        t.done()
    box = os.path.join(mnt, "mail")
    new, cur = sorted(os.listdir(os.path.join(box, "new"))), sorted(os.listdir(os.path.join(box, "cur")))
    t.check(len(new) == 2 and len(cur) == 1 and cur[0].endswith(":2,S"),
            "unseen messages are in new/, the seen one in cur/", f"new={new} cur={cur}")
    bodies = [open(os.path.join(box, "new", n), "rb").read() for n in new]
    t.check(len(bodies) == 2 and all(b"body of unseen" in b for b in bodies), "messages in new/ read", bodies)

    # A reader (mutt's mark_old) moves one to cur/ without reading it: it stays there.
    first = new[0]
    os.rename(os.path.join(box, "new", first), os.path.join(box, "cur", first))
    time.sleep(1.2)
    t.check(first in os.listdir(os.path.join(box, "cur")) and first not in os.listdir(os.path.join(box, "new")),
            "a reader's move from new/ to cur/ sticks", os.listdir(os.path.join(box, "cur")))

    # The card saves power: a flag change waits in the queue; `ghostctl sync` sends it now.
    os.rename(os.path.join(box, "cur", first), os.path.join(box, "cur", first.split(":2,")[0] + ":2,F"))
    queued = imap_stats(ctl).get("queued")
    r = harness.ghostctl(ctl, "sync", timeout=60)
    t.check(queued == 1 and r.returncode == 0 and "1 IMAP operation sent" in r.stdout and flagged_on_server(dc) == 1,
            "ghostctl sync sends a queued IMAP operation now", f"queued={queued} rc={r.returncode} {r.stdout}{r.stderr}")
    second = new[1]
    os.rename(os.path.join(box, "new", second), os.path.join(box, "cur", second.split(":2,")[0] + ":2,F"))
    r = harness.ghostctl(ctl, "flush", timeout=60)
    t.check(r.returncode == 0 and "1 IMAP operation sent" in r.stdout and flagged_on_server(dc) == 2
            and imap_stats(ctl).get("queued") == 0,
            "ghostctl flush sends the IMAP queue too", f"rc={r.returncode} {r.stdout}{r.stderr}")

    # The server goes away: sync says what it left; the unmount says what stays queued.
    seen = [n for n in os.listdir(os.path.join(box, "cur")) if n.endswith(":2,S")][0]
    with open(os.path.join(box, "cur", seen), "rb") as f:
        cached_body = f.read()  # read once: cached for the offline part below
    dc.stop()
    os.rename(os.path.join(box, "cur", seen), os.path.join(box, "cur", seen.split(":2,")[0] + ":2,FS"))
    r = harness.ghostctl(ctl, "sync", timeout=60)
    t.check(r.returncode == 1 and "still queued" in r.stdout, "sync with the server down says what it left (exit 1)",
            f"rc={r.returncode} {r.stdout}{r.stderr}")
    fs.stop()
    t.check("1 IMAP operation(s) stay queued" in fs.output(), "the unmount logs what stays queued",
            fs.output()[-1000:])

    # A wrong password: a few LOGIN attempts, not one per access; cached mail stays readable.
    dc.start()
    bad = os.path.join(work, "wrong-pw")
    with open(bad, "w") as f:
        f.write("wrong\n")
    fs = harness.Ghostfs(mnt, cache, {"mail": dc.url()}, args=["--password-file", f"mail={bad}"], control=ctl)
    if not t.check(fs.start(), "remounts with a wrong password", fs.output()):
        t.skip_rest(PLANNED, "no mount")
        t.done()
    start = time.time()
    readable = True
    names = []
    while time.time() - start < 8:
        try:
            names = os.listdir(os.path.join(box, "cur"))
        except OSError:
            pass
        time.sleep(0.1)
    tries = fs.output().count("cannot log in")
    t.check(1 <= tries <= 5, f"a wrong password is tried a few times in 8 s of constant access ({tries})",
            fs.output()[-1500:])
    try:
        got = [open(os.path.join(box, "cur", n), "rb").read() for n in names if n.split(":2,")[0] == seen.split(":2,")[0]]
        readable = got == [cached_body]
    except OSError as e:
        readable = e
    t.check(readable is True, "a cached message stays readable while the login is refused", f"{readable} {names}")
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
