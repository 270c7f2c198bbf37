#!/usr/bin/env python3
"""neomutt reads ghostfs's Maildir view of a real dovecot (DESIGN §4.4): driven in tmux, it lists
the seeded messages in its index and displays one (subject and body). The muttrc has no
network setting at all: neomutt sees a local Maildir. Skipped without root, /dev/fuse,
dovecot, neomutt or tmux."""
import imaplib
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402

PLANNED = 6
SUBJECTS = ["Lunch on Friday", "Quarterly report draft", "Ghost hints explained"]


def main():
    harness.require_root_and_fuse()
    for tool in ("neomutt", "tmux"):
        if not shutil.which(tool):
            harness.skip_all(f"{tool} is not installed")
    dc = harness.started_dovecot()
    t = harness.Tap(PLANNED)
    for i, s in enumerate(SUBJECTS):
        msg = (f"From: Sender {i} <s{i}@example.org>\r\nTo: me@example.org\r\nSubject: {s}\r\n"
               f"Message-ID: <m{i}@ghost.test>\r\nDate: Mon, {i + 1} Jan 2024 10:00:00 +0000\r\n\r\n"
               f"This is the body of message number {i}.\r\n")
        dc.seed("", msg.encode())
    work = harness.tempdir()
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    fs = harness.Ghostfs(mnt, os.path.join(work, "cache"), {"mail": dc.url()},
                         args=["--password-file", f"mail={dc.password_file()}"])
    if not t.check(fs.start(), "ghostfs mounts the dovecot origin", fs.output()):
        t.skip_rest(PLANNED, "no mount")
        t.done()
    maildir = os.path.join(mnt, "mail")
    rc = os.path.join(work, "muttrc")
    with open(rc, "w") as f:
        f.write(f"""set mbox_type = Maildir
set folder = "{maildir}"
set spoolfile = "{maildir}"
set header_cache = ""
set message_cachedir = ""
set sort = date
set mark_old = no
set wait_key = no
set pager_index_lines = 0
set confirmappend = no
set quit = yes
""")
    tm = harness.Tmux("ghost-neomutt")
    env_home = os.path.join(work, "home")
    os.makedirs(env_home)
    cmd = f"env HOME={env_home} TERM=screen neomutt -n -F {rc} -f {maildir}"
    r = tm.start(cmd)
    ok, text = tm.wait_screen(lambda s: all(x in s for x in SUBJECTS))
    t.check(r.returncode == 0 and ok, "neomutt's index lists the seeded subjects", f"{r.stderr}\n{text}")
    # Unseen server mail is in new/: neomutt flags it N (new), not O (old, as in cur/).
    rows = [line for line in text.splitlines() if any(x in line for x in SUBJECTS)]
    t.check(len(rows) == 3 and all(re.match(r"^\s*\d+\s+N\s", line) for line in rows),
            "neomutt shows the unseen messages as new (N)", text)
    # Open the first message (sorted by date: message 0).
    tm.keys("Enter")
    ok, text = tm.wait_screen(lambda s: "This is the body of message number 0." in s)
    t.check(ok and "Subject: Lunch on Friday" in text, "opening a message shows its subject and body", text)
    tm.keys("q")
    tm.keys("q")
    deadline = time.time() + 10
    while time.time() < deadline and tm.run("has-session", "-t", "ghost").returncode == 0:
        time.sleep(0.2)
    t.check(tm.run("has-session", "-t", "ghost").returncode != 0 and os.path.ismount(mnt),
            "neomutt quits (syncing the mailbox) and the mount stays up", tm.screen())
    tm.run("kill-server")

    def seen_on_server():
        c = imaplib.IMAP4("127.0.0.1", dc.port)
        c.login(dc.user, dc.password)
        c.select("INBOX", readonly=True)
        typ, d = c.uid("SEARCH", None, "SEEN")
        c.logout()
        return len(d[0].split())
    deadline = time.time() + 15
    while time.time() < deadline and seen_on_server() != 1:
        time.sleep(0.3)
    t.check(seen_on_server() == 1, "the message neomutt displayed is \\Seen on the server (its rename became UID STORE)",
            fs.output()[-800:])
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
