#!/usr/bin/env python3
"""ghostfs's Maildir view of a real dovecot on loopback, the write side (DESIGN §4.4):
- a UIDVALIDITY change while operations are queued loses none of them: flag changes, deletes
  and moves are sent to the message found again (Message-ID, or size and date), a message
  that vanished is APPENDed back from the cached copy, an ambiguous one is recorded in
  CACHE/imap-unapplied.jsonl; APPENDs always go out; ghostctl stats counts each outcome;
- unlink moves to Trash by default (the mailbox is created), `imap_delete = "expunge"` (config
  file) and `--imap-delete expunge` expunge;
- with --profile ipaq-2004 operations wait while the card is in PSM and go out in one batch
  when it enters CAM (power callback), or when the queue is over its cap.
Skipped without root, /dev/fuse or dovecot."""
import imaplib
import json
import mailbox
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import wait_for  # noqa: E402

PLANNED = 17


def message(subject, size, msgid=True):
    head = f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n"
    if msgid:
        head += f"Message-ID: <{subject}@ghost.test>\r\n"
    head += "Date: Mon, 1 Jan 2024 10:00:00 +0000\r\n\r\n"
    body = (f"body of {subject} " * (size // 16 + 1))[: max(0, size - len(head) - 2)]
    return (head + body + "\r\n").encode()


def server(dc, box):
    """{subject: [(uid, flags, body)]} as the server has them ({} if the mailbox is missing)."""
    c = imaplib.IMAP4("127.0.0.1", dc.port)
    c.login(dc.user, dc.password)
    out = {}
    typ, _ = c.select(f'"{box}"', readonly=True)
    if typ == "OK":
        typ, data = c.uid("SEARCH", None, "ALL")
        for uid in data[0].split():
            typ, d = c.uid("FETCH", uid, "(FLAGS BODY.PEEK[])")
            body = d[0][1]
            flags = [f.decode() for f in imaplib.ParseFlags(d[0][0])]
            subject = [ln for ln in body.split(b"\r\n") if ln.startswith(b"Subject: ")][0][9:].decode()
            out.setdefault(subject, []).append((int(uid), flags, body))
    c.logout()
    return out


def uidvalidity(dc, box):
    c = imaplib.IMAP4("127.0.0.1", dc.port)
    c.login(dc.user, dc.password)
    c.select(f'"{box}"', readonly=True)
    v = int(c.response("UIDVALIDITY")[1][0])
    c.logout()
    return v


def control(path, request):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    s.sendall((json.dumps(request) + "\n").encode())
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    return json.loads(buf)


def stats(ctl):
    exe = os.path.join(harness.build_dir(), "fs", "ghostctl")
    out = subprocess.run([exe, "--control", ctl, "--json", "stats"], capture_output=True, text=True, timeout=10)
    return json.loads(out.stdout).get("imap") or {}


def devices(ctl):
    exe = os.path.join(harness.build_dir(), "fs", "ghostctl")
    out = subprocess.run([exe, "--control", ctl, "--json", "devices"], capture_output=True, text=True, timeout=10)
    return json.loads(out.stdout)


def card_mode(ctl):
    return [d for d in devices(ctl) if d["kind"] != "disk"][0]["mode"]


def name_of(dirpath, subject):
    for n in os.listdir(dirpath):
        with open(os.path.join(dirpath, n), "rb") as f:
            if f"Subject: {subject}\r\n".encode() in f.read(300):
                return n
    return None


def resync(t, dc, work, pwfile):
    """UIDVALIDITY of "Work" changes while five operations wait for the server."""
    t0 = time.time() - 3600
    seeds = {"w4": 3300, "w1": 3000, "w2": 4100, "w3": 5200, "w5": 6300}
    for subject, size in seeds.items():
        p = dc.seed(".Work", message(subject, size))
        os.utime(p, (t0, t0))
        if subject == "w5":  # two copies: same Message-ID, size and date
            p = dc.seed(".Work", message(subject, size))
            os.utime(p, (t0, t0))
    mnt, cache, ctl = os.path.join(work, "mnt"), os.path.join(work, "cache"), os.path.join(work, "ctl.sock")
    os.makedirs(mnt)
    fs = harness.Ghostfs(mnt, cache, {"mail": dc.url()}, args=["--password-file", f"mail={pwfile}"], control=ctl)
    if not t.check(fs.start(), "ghostfs mounts a dovecot origin", fs.output()):
        return None
    cur = os.path.join(mnt, "mail", ".Work", "cur")
    harness.mark_old(os.path.join(mnt, "mail", ".Work"))  # unseen mail shows in new/; to cur/ as mutt does
    # By ",S=<size>" in the names, without reading a body (w2's must stay uncached).
    by_size = lambda s: sorted(n for n in os.listdir(cur) if f",S={len(message(s, seeds[s]))}:" in n)  # noqa: E731
    names = {s: (by_size(s) or [None])[0] for s in ("w1", "w2", "w3", "w4")}
    for s in ("w1", "w3", "w4"):  # read: their bodies are cached under the old UIDVALIDITY
        with open(os.path.join(cur, names[s]), "rb") as f:
            f.read()
    cached = wait_for(lambda: all(os.getxattr(os.path.join(cur, names[s]), "user.ghost.cached") == b"1"
                                  for s in ("w1", "w3", "w4")), 10)
    w5 = by_size("w5")
    old_v = uidvalidity(dc, "Work")
    os.listdir(os.path.join(mnt, "mail", "cur"))  # INBOX's summary, so a move into it can be queued offline

    dc.stop()
    flag = lambda n: n.split(":2,")[0] + ":2,F"  # noqa: E731
    os.rename(os.path.join(cur, names["w1"]), os.path.join(cur, flag(names["w1"])))
    os.unlink(os.path.join(cur, names["w2"]))
    os.rename(os.path.join(cur, names["w3"]), os.path.join(mnt, "mail", "cur", names["w3"]))
    os.rename(os.path.join(cur, names["w4"]), os.path.join(cur, flag(names["w4"])))
    if w5:
        os.rename(os.path.join(cur, w5[0]), os.path.join(cur, flag(w5[0])))
    md = mailbox.Maildir(os.path.join(mnt, "mail"), factory=None, create=False)
    md.get_folder("Work").add(message("w-added", 2500))
    queued = stats(ctl).get("queued")
    t.check(cached and len(w5) == 2 and queued == 6,
            "with the server down, flag/delete/move/append of messages in Work are queued", f"cached={cached} w5={w5} stats={stats(ctl)}")

    # The server rebuilds Work: a new UIDVALIDITY, w4 gone, every other UID shifted down.
    time.sleep(1.1)
    wdir = os.path.join(dc.maildir, ".Work")
    for sub in ("cur", "new"):
        for n in os.listdir(os.path.join(wdir, sub)):
            with open(os.path.join(wdir, sub, n), "rb") as f:
                if b"Subject: w4\r\n" in f.read(300):
                    os.unlink(os.path.join(wdir, sub, n))
    for root in (wdir, dc.maildir):
        for n in os.listdir(root):
            if n.startswith("dovecot"):
                os.unlink(os.path.join(root, n))
    dc.start()
    new_v = uidvalidity(dc, "Work")
    os.listdir(cur)  # a reader looks: ghostfs reconnects and the queue goes out
    drained = wait_for(lambda: stats(ctl).get("queued") == 0, 30)
    s = stats(ctl)
    work_box, inbox, trash = server(dc, "Work"), server(dc, "INBOX"), server(dc, "Trash")
    t.check(new_v != old_v and drained, "after the UIDVALIDITY change the queue drains",
            f"{old_v} -> {new_v} {s}\n{fs.output()[-1500:]}")
    t.check("\\Flagged" in work_box.get("w1", [(0, [], b"")])[0][1] and s.get("resync_retargeted", 0) >= 3,
            "a flag change reaches the message found by its Message-ID", f"{work_box.get('w1')} {s}")
    t.check("w2" not in work_box and "w2" in trash, "a delete (move to Trash) reaches the message found by size and date",
            f"work={sorted(work_box)} trash={sorted(trash)}")
    t.check("w3" not in work_box and "w3" in inbox, "a move reaches the message found again", sorted(inbox))
    w4 = work_box.get("w4", [])
    t.check(len(w4) == 1 and "\\Flagged" in w4[0][1] and w4[0][2] == message("w4", 3300) and s.get("resync_reappended") == 1,
            "a flagged message that vanished from the server is APPENDed back from the cache with its flag",
            f"{w4} {s}")
    unapplied = os.path.join(cache, "imap-unapplied.jsonl")
    lines = open(unapplied).read().splitlines() if os.path.exists(unapplied) else []
    rec = json.loads(lines[0]) if lines else {}
    t.check(len(work_box.get("w5", [])) == 2 and all("\\Flagged" not in m[1] for m in work_box.get("w5", []))
            and s.get("resync_unapplied") == 1 and rec.get("op") == "store" and rec.get("flags") == ["\\Flagged"]
            and "NOT applied" in fs.output(),
            "an ambiguous flag change is applied to neither copy, and recorded in imap-unapplied.jsonl and the log",
            f"{work_box.get('w5')} {s} {lines}")
    t.check("w-added" in work_box, "a message added during the outage is APPENDed", sorted(work_box))
    fs.stop()
    return mnt


def delete_modes(t, dc, work, pwfile, mnt):
    dc.seed("", message("d1", 2000))
    dc.seed("", message("d2", 2100))
    dc.seed("", message("d3", 2200))
    inbox_cur = os.path.join(mnt, "mail", "cur")

    conf = os.path.join(work, "ghostfs.toml")
    with open(conf, "w") as f:
        f.write('imap_delete = "expunge"\n')
    for label, args, subject in (("default (move:Trash)", [], "d1"), ('config imap_delete = "expunge"', ["--config", conf], "d2"),
                                 ("--imap-delete expunge", ["--imap-delete", "expunge"], "d3")):
        fs = harness.Ghostfs(mnt, os.path.join(work, "cache-" + subject), {"mail": dc.url()},
                             args=["--password-file", f"mail={pwfile}"] + args)
        if not fs.start():
            t.check(False, f"{label}: mounts", fs.output())
            continue
        harness.mark_old(os.path.join(mnt, "mail"))  # unseen mail shows in new/
        n = name_of(inbox_cur, subject)
        os.unlink(os.path.join(inbox_cur, n))
        gone = wait_for(lambda: subject not in server(dc, "INBOX"))
        in_trash = subject in server(dc, "Trash")
        want_trash = subject == "d1"
        t.check(gone and in_trash == want_trash, f"unlink with {label}: " + ("moved to Trash" if want_trash else "expunged"),
                f"gone={gone} in_trash={in_trash}\n{fs.output()[-800:]}")
        fs.stop()
    bad = subprocess.run([os.path.join(harness.build_dir(), "fs", "ghostfs"), "--cache", work, "--imap-delete", "trash",
                          mnt], capture_output=True, text=True, timeout=10)
    t.check(bad.returncode == 2 and "move:MAILBOX" in bad.stderr, "a bad --imap-delete is refused with a clear message",
            bad.stderr)


def deferral(t, dc, work, pwfile):
    """--profile ipaq-2004: the card starts in PSM; operations wait for CAM or the cap."""
    for i in range(3):
        dc.seed(".Defer", message(f"p{i}", 1500 + i))
    mnt, cache, ctl = os.path.join(work, "mnt-p"), os.path.join(work, "cache-p"), os.path.join(work, "ctl-p.sock")
    os.makedirs(mnt)
    fs = harness.Ghostfs(mnt, cache, {"mail": dc.url()},
                         args=["--password-file", f"mail={pwfile}", "--profile", "ipaq-2004"], control=ctl)
    if not t.check(fs.start(), "mounts with --profile ipaq-2004", fs.output()):
        return
    cur = os.path.join(mnt, "mail", ".Defer", "cur")
    harness.mark_old(os.path.join(mnt, "mail", ".Defer"))  # unseen mail shows in new/
    names = sorted(os.listdir(cur))
    wait_for(lambda: stats(ctl).get("origins", {}).get("mail", {}).get("connected"), 10)
    time.sleep(1)  # the listing's own traffic is over; the card is back in (or stays in) PSM
    wait_for(lambda: card_mode(ctl) == "PSM", 20)
    before = stats(ctl)
    for n in names[:2]:
        os.rename(os.path.join(cur, n), os.path.join(cur, n.split(":2,")[0] + ":2,S"))
    time.sleep(1.5)
    held = stats(ctl)
    flagged = lambda: sum("\\Seen" in m[0][1] for m in server(dc, "Defer").values())  # noqa: E731
    t.check(card_mode(ctl) == "PSM" and held.get("queued") == 2 and held.get("sent") == before.get("sent") and flagged() == 0,
            "while the card is in PSM two flag changes wait in the queue", f"{card_mode(ctl)} {held}")
    # Ghost hints count as transfers (DESIGN §3.3). The STPM module switches to CAM once its
    # run-length history says enough transfers are still to come: a first run of 20 hints
    # teaches it, the next run switches the card; the power callback sends the batch.
    for _ in range(4):
        for _ in range(20):
            control(ctl, {"op": "hint", "kind": "ghost", "device": "cisco-350", "time_s": 0.5, "energy_j": 0.5})
        if wait_for(lambda: card_mode(ctl) == "CAM", 1.5):
            break
        time.sleep(1.2)  # longer than the break-even time: the next hints start a new run
    sent = wait_for(lambda: stats(ctl).get("queued") == 0, 15)
    after = stats(ctl)
    t.check(sent and after.get("sent") == held.get("sent", 0) + 2 and
            after.get("flushes_power_callback", 0) > held.get("flushes_power_callback", 0) and wait_for(lambda: flagged() == 2),
            "when the card enters CAM the batch goes out (power callback)", f"{held} -> {after}")

    # Over the cap (64 operations) the queue goes out at once, waking the card.
    wait_for(lambda: card_mode(ctl) == "PSM", 30)
    held = stats(ctl)
    n = names[2]
    letters = ["F", "FS", "S", ""]
    path = os.path.join(cur, n)
    for i in range(66):
        new = n.split(":2,")[0] + ":2," + letters[i % 4]
        if os.path.basename(path) != new:
            os.rename(path, os.path.join(cur, new))
            path = os.path.join(cur, new)
    capped = wait_for(lambda: stats(ctl).get("flushes_cap", 0) > held.get("flushes_cap", 0), 10)
    drained = wait_for(lambda: stats(ctl).get("queued") == 0, 30)
    t.check(capped and drained, "more than 64 queued operations are sent at once (cap)", f"{held} -> {stats(ctl)}")
    fs.stop()


def main():
    harness.require_root_and_fuse()
    dc = harness.started_dovecot()
    t = harness.Tap(PLANNED)
    work = harness.tempdir()
    pwfile = dc.password_file()
    mnt = resync(t, dc, work, pwfile)
    if mnt is None:
        t.skip_rest(PLANNED, "no mount")
        t.done()
    delete_modes(t, dc, work, pwfile, mnt)
    deferral(t, dc, work, pwfile)
    t.done()


if __name__ == "__main__":
    main()
