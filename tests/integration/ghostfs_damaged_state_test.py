#!/usr/bin/env python3
"""ghostfs never crashes on a damaged file of its own (round 19, helper files19). Its mail origin
keeps three things across restarts: the saved listing of each mailbox (a cache object under
"imap-listing:" + URL + mailbox, read when the server is unreachable), the journal of queued
IMAP operations (CACHE/imap-journal) and the UIDs of appended messages that queued changes wait
for (CACHE/imap-appended.jsonl). Each was read with nlohmann's value()/get<>(), which throw
type_error on a field of another type: ghostfs aborted (SIGABRT) when it listed the mailbox, or
at every start while the file was there. Now a damaged listing is logged and not used (the
server's; the next listing replaces it), and a damaged journal record or appended line is kept
aside in FILE.damaged, named in the log, and the rest is loaded: a queued APPEND after the
damage is still queued, the mount is up.

The IMAP server is the scripted fake of ghostfs_imap_bad (no dovecot needed); it is closed for
the second and third mounts (the server unreachable: the saved state is what is shown).
Skipped without root or /dev/fuse."""
import base64
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from ghostfs_imap_bad_test import FakeImap  # noqa: E402

PLANNED = 12

# Saved listings of the wrong shape: each aborted ghostfs before (type_error 302 / 316, or const
# operator[] past a short entry), and each is what a control client's "store" may put there.
DAMAGED_MAILBOX_LISTS = [b'[["INBOX",5]]', b'[["INBOX"]]', b'{"INBOX":"/"}', b'[["\xff","/"]]', b'[[1e400,"/"]]']
DAMAGED_LISTINGS = {
    "uidvalidity a string": b'{"uidvalidity":"77","messages":[]}',
    "a message entry too short": b'{"uidvalidity":77,"messages":[[1]]}',
    "a size that is a string": b'{"uidvalidity":77,"messages":[[1,"4096","",1700000000]]}',
    "a huge uid": b'{"uidvalidity":77,"messages":[[1e400,10,"",0]]}',
    "messages not a list": b'{"uidvalidity":77,"messages":5}',
    "truncated JSON": b'{"uidvalidity":77,"messages":[[1,10,',
    "not UTF-8": b'{"uidvalidity":77,"messages":[[1,10,"\xff\xfe",0]]}',
}


def b64(data):
    return base64.b64encode(data).decode()


class SafeControl:
    """harness.Control whose ok() answers {} once the daemon is gone (so a crash fails the checks
    that follow instead of ending the test)."""

    def __init__(self, sock):
        try:
            self.ctl = harness.Control(sock)
        except OSError:
            self.ctl = None

    def ok(self, op, **args):
        try:
            return self.ctl.ok(op, **args) if self.ctl else {}
        except (OSError, RuntimeError, ValueError, AssertionError):
            self.ctl = None
            return {}


def fail_rest(t, why):
    """A mount that does not come up is the failure under test here (a crash at start), not
    something missing: the checks left fail."""
    while t.n < PLANNED:
        t.check(False, why)


def alive(fs):
    return fs.proc.poll() is None and os.path.ismount(fs.mnt)


def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as e:
        return f"errno {e.errno}"


def main():
    harness.require_root_and_fuse()
    t = harness.Tap(PLANNED)
    work = harness.tempdir()
    srv = FakeImap("malformed")  # lists two messages; misbehaves only on bodies and STORE
    pw = os.path.join(work, "pw")
    with open(pw, "w") as f:
        f.write("pw\n")
    mnt, cache, sock = os.path.join(work, "mnt"), os.path.join(work, "cache"), os.path.join(work, "ctl.sock")
    os.makedirs(mnt)
    key = "imap-listing:" + srv.url() + "INBOX"
    box = os.path.join(mnt, "mail")

    def mount():
        fs = harness.Ghostfs(mnt, cache, {"mail": srv.url()}, args=["--password-file", f"mail={pw}"], control=sock)
        return fs, fs.start()

    # 1. The server up: the listing is saved under its key.
    fs, up = mount()
    names = harness.mark_old(box) if up else []
    ctl = SafeControl(sock) if up else None
    saved = wait_for(lambda: ctl.ok("lookup", key=key).get("cached"), 10) if up else False
    good = None
    if saved:
        got = ctl.ok("lookup", key=key)
        if "body_base64" in got:
            good = base64.b64decode(got["body_base64"])
        else:
            with open(got["path"], "rb") as f:
                good = f.read()
    t.check(up and len(names) == 2 and good is not None and b'"uidvalidity":77' in good,
            f"the listing of INBOX is saved under {key!r}", f"names={names} good={good!r}\n{fs.output()[-800:]}")
    fs.stop()
    # Down for good: close() alone leaves the socket listening while the accept thread is
    # blocked in accept() on it (the kernel holds the file); shutdown wakes it.
    try:
        srv.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    srv.close()
    down = socket.socket()
    refused = down.connect_ex(("127.0.0.1", srv.port)) != 0
    down.close()

    # 2. The server down; each damaged listing in turn (stored, flushed to the store), then the
    # mailbox listed: the saved listing is read.
    fs, up = mount()
    if not up or not refused:
        t.check(False, "mounts with the server down", f"server refuses: {refused}\n{fs.output()[-1500:]}")
        fail_rest(t, "not run: ghostfs did not mount")
        t.done()
    ctl = SafeControl(sock)
    results = {}
    for what, body in DAMAGED_LISTINGS.items():
        if not alive(fs):
            results[what] = "ghostfs was dead before"
            continue
        if not ctl.ok("store", key=key, response="{}", content_type="application/json", body_base64=b64(body)) \
                or not ctl.ok("flush"):
            results[what] = "no answer from the control socket"
            continue
        seen = listing(os.path.join(box, "cur"))
        results[what] = (seen, alive(fs))
    out = fs.output()
    t.check(all(r[1] for r in results.values() if isinstance(r, tuple)) and len(results) == len(DAMAGED_LISTINGS)
            and all(isinstance(r, tuple) for r in results.values()) and alive(fs),
            "a damaged saved listing (wrong types, a short entry, a huge number, truncated, not UTF-8) "
            "does not stop ghostfs", f"{results}\n{out[-2500:]}")
    t.check(out.count("the saved listing of INBOX") >= len(DAMAGED_LISTINGS) and key in out,
            "each is logged as damaged, naming the cached key", out[-2500:])
    # The good listing back: shown offline, so the damaged ones were read where it is.
    ctl.ok("store", key=key, response="{}", content_type="application/json", body_base64=b64(good or b""))
    ctl.ok("flush")
    # (Unseen, so in new/ after a restart: the cur/ of mark_old was this view's, not the server's.)
    offline = [listing(os.path.join(box, d)) for d in ("new", "cur")]
    offline = offline[0] + offline[1] if all(isinstance(x, list) for x in offline) else offline
    t.check(isinstance(offline, list) and len(offline) == 2 and alive(fs),
            "the saved listing itself is still read (the same key, the server down)", f"{offline}\n{fs.output()[-800:]}")
    # A message the reader delivers meanwhile: an APPEND queued in the journal.
    message = b"From: me@example.org\r\nSubject: queued\r\n\r\nkeep me\r\n"
    try:
        with open(os.path.join(box, "tmp", "m1"), "wb") as f:
            f.write(message)
        os.rename(os.path.join(box, "tmp", "m1"), os.path.join(box, "new", "m1"))
    except OSError as e:
        print(f"# delivering m1: {e}", flush=True)
    queued = ctl.ok("stats").get("imap", {}).get("queued")
    fs.stop()

    # 3. The journal and the appended UIDs damaged: an ack of another type before the APPEND's
    # record, and two appended lines that are no UID.
    journal = os.path.join(cache, "imap-journal")
    with open(journal, "rb") as f:
        records = f.read()
    bad_ack = b'{"ack":"1"}\n'
    with open(journal, "wb") as f:
        f.write(bad_ack + records)
    appended = os.path.join(cache, "imap-appended.jsonl")
    bad_lines = [b'{"origin":"mail","mailbox":"INBOX","unique":"u1","uidvalidity":"77","uid":1}',
                 b'{"origin":"mail","mailbox":"INBOX","unique":"u2","uidvalidity":77,"uid":-1}',
                 b'{"origin":"mail","mailbox":"\xff","unique":"u3"}']
    with open(appended, "ab") as f:
        f.write(b"\n".join(bad_lines) + b"\n")
    fs, up = mount()
    ctl = SafeControl(sock) if up else None
    now_queued = ctl.ok("stats").get("imap", {}).get("queued") if up else None
    out = fs.output()
    t.check(up and now_queued is not None and alive(fs), "ghostfs starts with a damaged IMAP journal and appended-UID file, "
            "and answers", f"queued before the stop: {queued}\n{out[-2000:]}")
    if not up:
        fail_rest(t, "not run: ghostfs did not mount")
        t.done()

    def read(path):
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return b""
    t.check(queued == 1 and now_queued == 1 and read(journal + ".damaged") == bad_ack
            and f"{journal}: 12 bytes at offset 0" in out and f"kept in {journal}.damaged" in out,
            "the damaged journal record is kept aside and named in the log; the APPEND after it is still queued",
            f"queued {queued} -> {now_queued}; aside {read(journal + '.damaged')!r}\n{out[-2000:]}")
    aside = read(appended + ".damaged")
    t.check(all(line in aside for line in bad_lines) and out.count(f"{appended} line") == len(bad_lines)
            and f"kept in {appended}.damaged" in out,
            "each damaged appended-UID line is kept aside and named (file and line) in the log",
            f"aside {aside!r}\n{out[-2000:]}")
    # The files set aside are listed by the daemon (stats "kept_aside") and by ghostctl stats,
    # so that a user sees a change may wait in one; removed by hand, they drop out.
    kept = ctl.ok("stats").get("kept_aside")
    sizes = {k.get("path"): k.get("bytes") for k in kept} if isinstance(kept, list) else {}
    text = harness.ghostctl(sock, "stats").stdout
    rows = [next((line for line in text.splitlines() if f"{p}.damaged" in line), "") for p in (journal, appended)]
    t.check(sizes == {journal + ".damaged": len(bad_ack), appended + ".damaged": len(aside)}
            and all(row.lstrip().startswith("kept aside") for row in rows),
            "ghostctl stats (and its JSON's kept_aside) lists both files set aside, with their sizes",
            f"kept_aside {kept}\n{text}")
    os.unlink(appended + ".damaged")
    kept = ctl.ok("stats").get("kept_aside")
    t.check(isinstance(kept, list) and [k.get("path") for k in kept] == [journal + ".damaged"],
            "a file set aside and removed by hand is no longer listed", f"kept_aside {kept}")
    new = listing(os.path.join(box, "new"))
    t.check(isinstance(new, list) and any(n.startswith("m1") for n in new) and alive(fs),
            "the queued message is shown, the mount is up", f"new={new}\n{fs.output()[-800:]}")
    # 4. The saved list of mailboxes (read when LIST cannot reach the server), damaged: the
    # first one stored now, read at the next mount's first listing; the others in turn there.
    boxes_key = "imap-mailboxes:" + srv.url()
    ctl.ok("store", key=boxes_key, response="{}", content_type="application/json",
           body_base64=b64(DAMAGED_MAILBOX_LISTS[0]))
    ctl.ok("flush")
    fs.stop()
    fs, up = mount()
    seen = {}
    if up:
        ctl = SafeControl(sock)
        for i, body in enumerate(DAMAGED_MAILBOX_LISTS):
            if not alive(fs):
                break
            if i:
                ctl.ok("store", key=boxes_key, response="{}", content_type="application/json", body_base64=b64(body))
                ctl.ok("flush")
            seen[body] = (listing(box), alive(fs))
    out = fs.output()
    t.check(up and len(seen) == len(DAMAGED_MAILBOX_LISTS) and all(a for _, a in seen.values()) and alive(fs),
            "a damaged saved list of mailboxes (wrong types, a short entry, not a list, not UTF-8, a huge number) "
            "does not stop ghostfs", f"{seen}\n{out[-2000:]}")
    t.check(out.count(f"the saved list of mailboxes (cached as {boxes_key}) is damaged") >= 1,
            "it is logged as damaged, naming the cached key", out[-2000:])
    if up:
        fs.stop()
    t.done()


if __name__ == "__main__":
    main()
