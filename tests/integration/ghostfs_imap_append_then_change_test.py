#!/usr/bin/env python3
"""A change the reader made to a message it delivered, queued behind that message's APPEND, is
not dropped when the daemon is killed after the APPEND went through and before the change was
sent (fs/mail_tree.cc: the APPEND's UID is kept in CACHE/imap-appended.jsonl before the APPEND
is acknowledged; MailTree::Start reads it back). Before, the replayed change had no UID to go
to and was dropped ("the appended message's UID is unknown"): ghostfs_mail_random saw it
(seed 4242, a kill round). The moment is made on purpose with a relay between ghostfs and
dovecot: connections refused while the delivery and a flag rename are queued, then passed on
until the server's OK to the APPEND, after which the relay holds everything, and ghostfs is
killed. After the remount the server must hold the message once, with the flag; and once the
change is applied, its line leaves imap-appended.jsonl while ghostfs runs (before, only the next
start pruned the file, which grew one line per delivered-then-changed message).
Skipped without root, /dev/fuse or dovecot."""
import os
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402
from harness import wait_for  # noqa: E402

PLANNED = 10
MESSAGE = (b"From: a@example.org\r\nTo: b@example.org\r\nSubject: delivered-then-flagged\r\n"
           b"Message-ID: <delivered-then-flagged@ghost.test>\r\n\r\nbody\r\n")


class Relay:
    """127.0.0.1:port -> dovecot. mode: "pass", "refuse" (accept and close at once), or
    "hold-after-append" (pass until the server's tagged OK [APPENDUID ...] went to the client,
    then pass nothing more either way; `appended` is set), or "hold-after-store" (the same after
    the first tagged OK to a STORE; `stored` is set)."""

    def __init__(self, target_port):
        self.target = target_port
        self.mode = "pass"
        self.appended = threading.Event()
        self.stored = threading.Event()
        self.held = False
        self.open = []  # every socket of the connections relayed
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            c, _ = self.sock.accept()
            if self.mode == "refuse":
                c.close()
                continue
            s = socket.create_connection(("127.0.0.1", self.target))
            self.open += [c, s]
            threading.Thread(target=self.pipe, args=(c, s, False), daemon=True).start()
            threading.Thread(target=self.pipe, args=(s, c, True), daemon=True).start()

    def pipe(self, src, dst, from_server):
        buf = b""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data or self.held:
                if not data:
                    for x in (src, dst):
                        try:
                            x.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                    return
                continue  # held: read and dropped
            try:
                dst.sendall(data)
            except OSError:
                return
            if from_server and self.mode == "hold-after-append":
                buf = (buf + data)[-4096:]
                if re.search(rb"\r\n\S+ OK \[APPENDUID ", b"\r\n" + buf):
                    self.held = True
                    self.appended.set()
            if from_server and self.mode == "hold-after-store":
                buf = (buf + data)[-4096:]
                if re.search(rb"\r\n\S+ OK Store completed", b"\r\n" + buf):
                    self.held = True
                    self.stored.set()

    def drop_all(self):
        """Refuses new connections and ends the open ones (ghostfs sees its connection close)."""
        self.mode = "refuse"
        for x in self.open:
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.open = []


def main():
    h.require_root_and_fuse()
    dc = h.started_dovecot()
    t = h.Tap(PLANNED)
    work = h.tempdir()
    relay = Relay(dc.port)
    url = f"imap://{dc.user}@127.0.0.1:{relay.port}/"
    fs, mnt, ctl = h.mount_origin(t, PLANNED, work, {"mail": url}, check="ghostfs mounts dovecot through the relay",
                                  args=["--password-file", f"mail={dc.password_file()}"])
    inbox = os.path.join(mnt, "mail")
    os.listdir(os.path.join(inbox, "new"))  # the listing is loaded while the server answers

    # The server cannot be reached: the delivery and the flag change wait in the queue.
    relay.drop_all()
    tmp = os.path.join(inbox, "tmp", "delivered.host")
    with open(tmp, "wb") as f:
        f.write(MESSAGE)
    os.rename(tmp, os.path.join(inbox, "new", "delivered.host"))
    os.rename(os.path.join(inbox, "new", "delivered.host"), os.path.join(inbox, "cur", "delivered.host:2,F"))
    queued = h.ghostctl_json(ctl, "stats").get("imap", {}).get("queued")
    t.check(queued == 2, "the delivery and its flag change are queued while the server is away", queued)

    # Sent: the APPEND goes through, then the relay holds everything; killed before the change.
    relay.mode = "hold-after-append"
    sync = subprocess.Popen([os.path.join(h.build_dir(), "fs", "ghostctl"), "--control", ctl, "sync"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    appended = relay.appended.wait(30)
    time.sleep(1.5)  # the ack is journaled and the next operation sent (into the relay)
    fs.kill9()
    sync.kill()
    sync.wait()
    on_server = [b for _, b in dc.messages() if b"delivered-then-flagged" in b]
    t.check(appended and len(on_server) == 1,
            "the APPEND reached the server before the kill, the flag change did not",
            (appended, len(on_server), fs.output()[-1500:]))

    appended_file = os.path.join(fs.cache, "imap-appended.jsonl")
    kept_line = os.path.exists(appended_file) and "delivered" in open(appended_file).read()
    relay.held = False
    relay.mode = "pass"
    fs = fs.again()
    if not t.check(fs.start(), "mounted again over the same cache", fs.output()[-1500:]):
        t.skip_rest(PLANNED, "no mount")
        t.done()
    r = h.ghostctl(ctl, "sync", timeout=60)
    drained = wait_for(lambda: h.ghostctl_json(ctl, "stats").get("imap", {}).get("queued") == 0, 30)
    msgs = [(flags, b) for flags, b in dc.messages() if b"delivered-then-flagged" in b]
    t.check(drained and len(msgs) == 1, "after the replay the server holds the message once",
            (r.stdout, r.stderr, len(msgs)))
    t.check(len(msgs) == 1 and "\\Flagged" in msgs[0][0],
            "the flag change queued behind the APPEND reached the server (not dropped after the kill)",
            (msgs, fs.output()[-2000:]))
    t.check("UID is unknown" not in fs.output(), "no operation was dropped for an unknown UID", fs.output()[-2000:])
    # The change is applied: its line leaves imap-appended.jsonl while ghostfs runs (before,
    # only the next start pruned it, so the file grew one line per delivered-then-changed
    # message). The file is replaced by rename: no temporary file is left either.
    appended_file = os.path.join(fs.cache, "imap-appended.jsonl")
    left = open(appended_file).read() if os.path.exists(appended_file) else ""
    t.check(kept_line and "delivered" not in left and not os.path.exists(appended_file + ".tmp"),
            "once the change is applied, its UID's line is pruned from imap-appended.jsonl while running",
            (kept_line, left, os.listdir(fs.cache)))

    # Two deliveries and their flag changes, queued APPEND a, APPEND b, STORE a, STORE b; killed
    # once STORE a went through: the running prune has rewritten the file with b's line only,
    # and b's change, still queued, finds its UID after the remount.
    relay.drop_all()
    for name in ("second-a.host", "second-b.host"):
        with open(os.path.join(inbox, "tmp", name), "wb") as f:
            f.write(MESSAGE.replace(b"delivered-then-flagged", name.encode()))
        os.rename(os.path.join(inbox, "tmp", name), os.path.join(inbox, "new", name))
    for name in ("second-a.host", "second-b.host"):
        os.rename(os.path.join(inbox, "new", name), os.path.join(inbox, "cur", name + ":2,F"))
    queued = h.ghostctl_json(ctl, "stats").get("imap", {}).get("queued")
    relay.held = False
    relay.mode = "hold-after-store"
    sync = subprocess.Popen([os.path.join(h.build_dir(), "fs", "ghostctl"), "--control", ctl, "sync"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stored = relay.stored.wait(30)
    time.sleep(1.5)  # the ack is journaled, the file pruned, and STORE b sent (into the relay)
    fs.kill9()
    sync.kill()
    sync.wait()
    left = open(appended_file).read() if os.path.exists(appended_file) else ""
    t.check(queued == 4 and stored and "second-b" in left and "second-a" not in left
            and not os.path.exists(appended_file + ".tmp"),
            "killed after the first change was applied: imap-appended.jsonl holds the second's line only",
            (queued, stored, left))
    relay.held = False
    relay.mode = "pass"
    fs = fs.again()
    fs.start()
    h.ghostctl(ctl, "sync", timeout=60)
    wait_for(lambda: h.ghostctl_json(ctl, "stats").get("imap", {}).get("queued") == 0, 30)
    flagged = {n: [f for f, b in dc.messages() if n.encode() in b] for n in ("second-a", "second-b")}
    t.check(all(len(v) == 1 and "\\Flagged" in v[0] for v in flagged.values()) and "UID is unknown" not in fs.output()
            and not os.path.exists(appended_file),
            "after the remount both changes are on the server, no UID lost, and the file is gone",
            (flagged, fs.output()[-1500:]))
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
