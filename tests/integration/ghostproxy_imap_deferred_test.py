#!/usr/bin/env python3
"""ghostproxy's deferred IMAP changes (proxy/imap_deferred.h) in front of a real dovecot on
127.0.0.1, with a ghostfs whose emulated network card sleeps in PSM: while the card is low, a
client's UID STORE through the proxy is answered at once (with the flags it will have) and
nothing reaches dovecot; FETCH FLAGS through the proxy agrees with what the client was told; a
SEARCH that depends on the flags sends the queue first and sees the change; `ghostctl flush`
sends the queue; a message expunged upstream meanwhile is a conflict written to the unapplied
file, not lost; a change journaled before a SIGKILL is sent after the restart, once its user
logs in again; the knob-scaled deadline sends what waits; the card entering its high-power mode
sends it. Offline (dovecot stopped), a login dovecot accepted before gets the cached body and
everything that needs the server NO [UNAVAILABLE] at once. TAP; skipped without root, /dev/fuse or dovecot."""
import imaplib
import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 19


def message(subject, seed):
    return (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n"
            f"Message-ID: <{subject}.{seed}@ghost>\r\n\r\nbody {seed}\r\n").encode()


def main():
    t, dc, imap = h.held_mail(PLAN, [message(f"m{i}", i) for i in range(6)])
    iport, start, log, journal, ctl = imap.port, imap.start, imap.log, imap.journal, imap.ctl
    unapplied = journal + ".unapplied"
    ghostctl = os.path.join(h.build_dir(), "fs", "ghostctl")

    def server_flags():
        """{uid: flags} as dovecot has them."""
        d = dc.login()
        d.select("INBOX", readonly=True)
        out = {}
        for item in d.uid("FETCH", "1:*", "(FLAGS)")[1]:
            text = item.decode()
            uid = int(text.split("UID ")[1].split()[0].rstrip(")"))
            out[uid] = text.split("FLAGS (")[1].split(")")[0].split()
        d.logout()
        return out

    def client():
        c = imaplib.IMAP4("127.0.0.1", iport)
        c.login(dc.user, dc.password)
        c.select("INBOX")
        c.uid("FETCH", "1:*", "(FLAGS)")  # the proxy learns the flags
        return c

    proxy = imap.start_checked(t, PLAN, 120)
    time.sleep(1)  # subscribed to ghostfs's modes
    uids = sorted(server_flags())

    # A flag change while the card sleeps: answered at once, not at the server.
    c = client()
    typ, data = c.uid("STORE", str(uids[0]), "+FLAGS", "(\\Flagged)")
    answer = b" ".join(x for x in data if isinstance(x, bytes))
    t.check(typ == "OK" and b"\\Flagged" in answer, "UID STORE +FLAGS is answered with the flags it will have",
            f"{typ} {data} " + open(log).read()[-300:])
    t.check("\\Flagged" not in server_flags()[uids[0]] and os.path.getsize(journal) > 0,
            "the change waits in the journal, not at dovecot", server_flags())
    typ, data = c.uid("FETCH", str(uids[0]), "(FLAGS)")
    t.check(b"\\Flagged" in data[0], "FETCH FLAGS through the proxy shows the deferred change", data)

    # SEARCH depends on the flags upstream: the queue goes first.
    typ, data = c.uid("SEARCH", None, "FLAGGED")
    t.check(typ == "OK" and str(uids[0]).encode() in data[0].split() and "\\Flagged" in server_flags()[uids[0]],
            "a SEARCH sends the queued changes first and sees them", f"{data} " + open(log).read()[-600:])

    # ghostctl flush sends the proxy's queue too.
    typ, _ = c.uid("STORE", str(uids[1]), "+FLAGS.SILENT", "(\\Answered)")
    queued = "\\Answered" not in server_flags()[uids[1]]
    subprocess.run([ghostctl, "--control", ctl, "flush"], capture_output=True, timeout=30)
    t.check(typ == "OK" and queued and h.wait_for(lambda: "\\Answered" in server_flags()[uids[1]], timeout=10),
            "ghostctl flush sends the deferred changes", open(log).read()[-300:])

    # A conflict: the message is expunged upstream while its change waits.
    typ, _ = c.uid("STORE", str(uids[2]), "+FLAGS.SILENT", "($Ghost)")
    d = dc.login()
    d.select("INBOX")
    d.uid("STORE", str(uids[2]), "+FLAGS.SILENT", "(\\Deleted)")
    d.expunge()
    d.logout()
    os.kill(proxy.pid, signal.SIGUSR1)

    def recorded():
        if not os.path.exists(unapplied):
            return None
        rows = [json.loads(x) for x in open(unapplied)]
        return rows if any(r["uid"] == uids[2] for r in rows) else None
    rows = h.wait_for(recorded, timeout=10)
    t.check(typ == "OK" and rows and "gone" in rows[-1]["why"],
            "a change to a message expunged upstream is recorded as unapplied, not lost",
            f"{rows} " + open(log).read()[-300:])
    c.logout()

    # SIGKILL with a change queued: replayed after the restart, once its user logs in.
    c = client()
    typ, _ = c.uid("STORE", str(uids[3]), "+FLAGS.SILENT", "(\\Seen)")
    proxy.kill()
    proxy.wait(10)
    t.check(typ == "OK" and "\\Seen" not in server_flags()[uids[3]], "a change is queued when the proxy is killed")
    proxy = start(3)
    h.wait_port(iport, 15)
    time.sleep(1)
    c = imaplib.IMAP4("127.0.0.1", iport)
    c.login(dc.user, dc.password)
    t.check(h.wait_for(lambda: "\\Seen" in server_flags()[uids[3]], timeout=10),
            "the journal is replayed after a SIGKILL: the change reaches dovecot", open(log).read()[-400:])
    c.logout()

    # The deadline (imap_deadline 3 s at the knob's 50): a change does not wait forever.
    c = client()
    typ, _ = c.uid("STORE", str(uids[4]), "+FLAGS.SILENT", "(\\Flagged)")
    early = "\\Flagged" in server_flags()[uids[4]]
    t.check(typ == "OK" and not early and h.wait_for(lambda: "\\Flagged" in server_flags()[uids[4]], timeout=10),
            "the deadline sends a deferred change", open(log).read()[-300:])
    c.logout()
    proxy.terminate()
    proxy.wait(10)

    # The card entering its high-power mode sends the queue long before the deadline.
    proxy = start(120)
    h.wait_port(iport, 15)
    time.sleep(1)
    c = client()
    typ, _ = c.uid("STORE", str(uids[5]), "+FLAGS.SILENT", "(\\Answered)")
    quiet = typ == "OK" and "\\Answered" not in server_flags()[uids[5]]
    ctlc = h.Control(ctl)
    sent = False
    for _ in range(10):
        # Ghost hints count as transfers (DESIGN §3.3): a first run teaches the STPM module, a
        # later run switches the card to CAM (as in ghostproxy_smtp_test.py).
        ctlc.ghost_hints()
        sent = h.wait_for(lambda: "\\Answered" in server_flags()[uids[5]], timeout=1.5)
        if sent:
            break
        time.sleep(1.2)
    ctlc.close()
    t.check(quiet and sent, "the card entering its high-power mode sends the deferred changes",
            f"quiet {quiet} sent {sent}; " + open(log).read()[-300:])
    # A body fetched through the proxy, for the offline checks below.
    body = c.uid("FETCH", str(uids[0]), "(BODY.PEEK[])")[1][0][1]

    c.logout()

    # Its fill is in ghostfs's cache under the Maildir view's key.
    d = imaplib.IMAP4("127.0.0.1", dc.port)
    d.login(dc.user, dc.password)
    d.select("INBOX", readonly=True)
    validity = d.response("UIDVALIDITY")[1][0].decode()
    d.logout()
    key = f"imap://{dc.user}@127.0.0.1:{dc.port}/INBOX;UIDVALIDITY={validity};UID={uids[0]}"
    ctlc = h.Control(ctl)
    stored = h.wait_for(lambda: ctlc.call("lookup", key=key).get("result", {}).get("cached") or None, timeout=15)
    ctlc.close()
    t.check(stored, "a body fetched through the proxy is stored in the cache", key + "; " + open(log).read()[-500:])

    # Offline: dovecot gone. The proxy greets, takes a login dovecot accepted before, serves
    # the cached body and says NO [UNAVAILABLE] at once to what needs the server.
    dc.stop()
    offline = {}
    try:
        o = imaplib.IMAP4("127.0.0.1", iport)
        offline["greeting"] = o.welcome
        offline["login"] = o.login(dc.user, dc.password)[0]
        offline["select"] = o.select("INBOX")[0]
        typ, data = o.uid("FETCH", str(uids[0]), "(BODY.PEEK[])")
        offline["body"] = typ == "OK" and data[0][1] == body
        t0 = time.time()
        typ, data = o.uid("FETCH", str(uids[1]), "(BODY.PEEK[])")
        offline["uncached"] = (typ, data, round(time.time() - t0, 1))
        typ, data = o.list()
        offline["list"] = (typ, data)
        o.logout()
    except Exception as e:  # noqa: BLE001 - reported below
        offline["error"] = repr(e)
    t.check(offline.get("login") == "OK" and offline.get("select") == "OK" and offline.get("body") is True,
            "offline: a cached body is served after a login the server accepted before",
            f"{offline} " + open(log).read()[-300:])
    unc, lst = offline.get("uncached", ("", [b""], 99)), offline.get("list", ("", [b""]))
    t.check(unc[0] == "NO" and b"UNAVAILABLE" in unc[1][0] and unc[2] < 5 and lst[0] == "NO",
            "offline: an uncached body and LIST get NO [UNAVAILABLE] at once", offline)
    try:
        o = imaplib.IMAP4("127.0.0.1", iport)
        o.login(dc.user, "wrong password")
        wrong = "accepted"
    except imaplib.IMAP4.error as e:
        wrong = str(e)
    t.check("UNAVAILABLE" in wrong, "offline: a login never accepted before is refused", wrong)

    # Offline, a deletion waits too: the flag change and the EXPUNGE are answered from what the
    # proxy knew, the message is gone from the next offline session's view, and once the server
    # is back `ghostctl flush` expunges it there.
    gone = uids[4]  # (uids[2] was expunged upstream above)
    expunged = {}
    try:
        o = imaplib.IMAP4("127.0.0.1", iport)
        o.login(dc.user, dc.password)
        typ, data = o.select("INBOX")
        before = int(data[0])
        typ, data = o.uid("STORE", str(gone), "+FLAGS.SILENT", "(\\Deleted)")
        expunged["store"] = typ if typ == "OK" else (typ, data)
        typ, data = o.expunge()
        expunged["expunge"] = (typ, data)
        typ, first = o.fetch("1", "(BODY.PEEK[])")  # the first message, cached: numbers unchanged below it
        expunged["first"] = typ == "OK" and first[0][1] == body
        o.logout()
        o = imaplib.IMAP4("127.0.0.1", iport)
        o.login(dc.user, dc.password)
        typ, data = o.select("INBOX")
        expunged["exists"] = (before, int(data[0]))
        o.logout()
    except Exception as e:  # noqa: BLE001 - reported below
        expunged["error"] = repr(e)
    ex = expunged.get("expunge", ("", [None]))
    t.check(expunged.get("store") == "OK" and ex[0] == "OK" and len(ex[1]) == 1 and ex[1][0] is not None and
            expunged.get("first") is True and expunged.get("exists", (0, 0))[1] == expunged.get("exists", (0, 0))[0] - 1,
            "offline: UID STORE \\Deleted and EXPUNGE are deferred, and the next session sees one message fewer",
            f"{expunged} " + open(log).read()[-300:])
    on_server_before = gone in server_flags() if dc.start() else None
    subprocess.run([ghostctl, "--control", ctl, "flush"], capture_output=True, timeout=30)
    t.check(on_server_before is True and h.wait_for(lambda: gone not in server_flags(), timeout=15),
            "offline: the deferred EXPUNGE reaches the server once it is back and the queue is sent",
            f"before {on_server_before}; " + open(log).read()[-300:])

    # Nothing was left behind: the queue is empty and the proxy is alive.
    t.check(proxy.poll() is None and "deferred" in open(log).read(),
            "the proxy lives on, having logged its deferred sends", open(log).read()[-300:])
    journal_rows = [ln for ln in open(journal, "rb").read().split(b"\n") if ln.startswith(b"{\"op\"")]
    acks = [ln for ln in open(journal, "rb").read().split(b"\n") if ln.startswith(b"{\"ack\"")]
    t.check(len(journal_rows) <= len(acks), "every journaled change is acknowledged",
            f"{len(journal_rows)} ops, {len(acks)} acks")
    t.done()


if __name__ == "__main__":
    main()
