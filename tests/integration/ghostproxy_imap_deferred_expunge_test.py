#!/usr/bin/env python3
"""ghostproxy defers EXPUNGE, UID EXPUNGE, MOVE/UID MOVE and CLOSE (proxy/imap_proxy.h "Deferred
changes") in front of a real dovecot on 127.0.0.1, with a ghostfs whose emulated network card
sleeps in PSM, and keeps the client's view consistent: after expunging 2 of 5 messages the client
gets its untagged EXPUNGEs at once while dovecot still has 5; FETCH 1:* (UID FLAGS), SEARCH ALL,
UID FETCH 1:*, UID SEARCH ALL and a body FETCH by sequence number agree with the client's view; a
UID MOVE to another mailbox is shown as an EXPUNGE; after `ghostctl flush` dovecot has exactly the
remaining messages (and the moved one in the destination), and the server's own EXPUNGEs are not
shown to the client again. A deferred CLOSE expunges on the server only at the flush.
TAP; skipped without root, /dev/fuse, dovecot or nginx."""
import imaplib
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 13


def message(subject, seed):
    return (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n"
            f"Message-ID: <{subject}.{seed}@ghost>\r\n\r\nbody {seed}\r\nline two\r\n").encode()


def main():
    originals = [message(f"m{i}", i) for i in range(5)]
    t, dc, imap = h.held_mail(PLAN, originals)
    iport, tail, ctl = imap.port, imap.tail, imap.ctl
    ghostctl = os.path.join(h.build_dir(), "fs", "ghostctl")
    direct, bodies = dc.login, dc.bodies

    d = direct()
    for box in ("Archive",):
        d.create(box)
    d.select("INBOX", readonly=True)
    uids = [int(x) for x in d.uid("SEARCH", None, "ALL")[1][0].split()]
    validity = d.response("UIDVALIDITY")[1][0].decode()
    d.logout()
    # The last message's body is in the cache (as a fetch through the proxy or the mount leaves
    # it), so a FETCH of it while others are hidden can be answered without the server.
    ctlc = h.Control(ctl)
    fill = ctlc.ok("store", key=f"imap://{dc.user}@127.0.0.1:{dc.port}/INBOX;UIDVALIDITY={validity};UID={uids[4]}",
                   response=json.dumps({"status": 200, "headers": [["Content-Type", "message/rfc822"]]}))["path"]
    with open(fill, "wb") as f:
        f.write(originals[4])
    ctlc.close()

    proxy = imap.start_checked(t, PLAN)
    time.sleep(1)  # subscribed to ghostfs's modes

    c = imaplib.IMAP4("127.0.0.1", iport)
    c.login(dc.user, dc.password)
    c.select("INBOX")
    # \Deleted set at dovecot (a queued flag change would make SEARCH send the queue first).
    d = direct()
    d.select("INBOX")
    d.uid("STORE", f"{uids[1]},{uids[3]}", "+FLAGS.SILENT", "(\\Deleted)")
    d.logout()
    c.uid("FETCH", "1:*", "(FLAGS)")  # the proxy learns the flags
    typ, data = c.expunge()
    t.check(typ == "OK" and sorted(data) == [b"2", b"4"] and len(bodies("INBOX")) == 5,
            "EXPUNGE of 2 of 5 is answered with its untagged EXPUNGEs at once; dovecot still has 5",
            f"{typ} {data} {len(bodies('INBOX'))} " + tail())
    left = [uids[0], uids[2], uids[4]]

    def fetch_view():
        typ, data = c.fetch("1:*", "(UID FLAGS)")
        out = []
        for item in data:
            text = item.decode() if isinstance(item, bytes) else item[0].decode()
            if "UID " not in text:  # an unsolicited FLAGS change imaplib kept from an earlier command
                continue
            out.append((int(text.split()[0]), int(text.split("UID ")[1].split()[0].rstrip(")"))))
        return typ, out
    typ, view = fetch_view()
    t.check(typ == "OK" and view == [(1, left[0]), (2, left[1]), (3, left[2])],
            "FETCH 1:* (UID FLAGS) shows the 3 left, numbered 1..3", f"{view} " + tail())
    typ, data = c.search(None, "ALL")
    typ2, data2 = c.uid("SEARCH", None, "ALL")
    t.check(typ == "OK" and data[0].split() == [b"1", b"2", b"3"] and
            [int(x) for x in data2[0].split()] == left, "SEARCH ALL and UID SEARCH ALL agree with the client's view",
            f"{data} {data2} " + tail())
    typ, data = c.uid("FETCH", "1:*", "(FLAGS)")
    seen = [int(x.decode().split("UID ")[1].split()[0].rstrip(")")) for x in data if isinstance(x, bytes)]
    t.check(typ == "OK" and seen == left, "UID FETCH 1:* hides the expunged", f"{data} " + tail())
    # A deferred flag change's answer carries the client's sequence number (3), not dovecot's (5).
    typ, data = c.uid("STORE", str(uids[4]), "+FLAGS", "(\\Flagged)")
    t.check(typ == "OK" and any(x.startswith(b"3 (UID %d FLAGS" % uids[4]) and b"\\Flagged" in x for x in data),
            "a deferred UID STORE answers with the client's sequence number", f"{data} " + tail())

    typ, data = c.uid("MOVE", str(uids[0]), "Archive")
    t.check(typ == "OK" and bodies("Archive") == [] and len(bodies("INBOX")) == 5,
            "UID MOVE is answered at once; nothing reaches dovecot", f"{typ} {data} " + tail())
    typ, view = fetch_view()
    # FETCH by sequence number of a cached body while messages are hidden: from the cache, under
    # the client's number (the server would have answered for its message 5, and its transfer
    # would have woken the card and sent the queue).
    typ2, tagged = c._simple_command("FETCH", "2", "(BODY.PEEK[])")
    fetched = [x for x in c.untagged_responses.pop("FETCH", []) if isinstance(x, tuple)]
    t.check(typ == "OK" and view == [(1, uids[2]), (2, uids[4])] and typ2 == "OK" and
            [x[1] for x in fetched] == [originals[4]] and fetched[0][0].startswith(b"2 ("),
            "after the MOVE the client sees 2 messages; FETCH 2 BODY.PEEK[] is its second one",
            f"{view} {[x[0] for x in fetched]} " + tail())
    t.check(b"from the cache" in tagged[0] and len(bodies("INBOX")) == 5,
            "a FETCH by sequence number of a cached body is answered from the cache while others are hidden",
            f"{tagged} {len(bodies('INBOX'))} " + tail())

    subprocess.run([ghostctl, "--control", ctl, "flush"], capture_output=True, timeout=30)
    h.wait_for(lambda: len(bodies("INBOX")) == 2 or None, timeout=10)
    t.check(bodies("INBOX") == sorted([originals[2], originals[4]]) and bodies("Archive") == [originals[0]],
            "after ghostctl flush dovecot has exactly the 2 left, and the moved one in Archive",
            f"{len(bodies('INBOX'))} {len(bodies('Archive'))} " + tail())
    typ, data = c.noop()
    typ2, view = fetch_view()
    typ3, data3 = c.search(None, "ALL")
    t.check(typ == "OK" and view == [(1, uids[2]), (2, uids[4])] and data3[0].split() == [b"1", b"2"],
            "after the flush the server's EXPUNGEs are not shown again; the view is unchanged",
            f"{c.untagged_responses} {view} {data3} " + tail())

    # CLOSE with a \Deleted message: answered at once, expunged on the server at the flush.
    c.uid("FETCH", "1:*", "(FLAGS)")
    c.uid("STORE", str(uids[2]), "+FLAGS.SILENT", "(\\Deleted)")
    typ, _ = c.close()
    kept = len(bodies("INBOX")) == 2
    typ2, _ = c.select("INBOX")  # a mailbox with queued changes: the queue goes first
    n = int(c.response("EXISTS")[1][-1])
    t.check(typ == "OK" and kept and typ2 == "OK" and n == 1 and bodies("INBOX") == [originals[4]],
            "a deferred CLOSE expunges on the server only when the queue is sent (SELECT sends it first)",
            f"{typ} kept {kept} {n} " + tail())
    c.logout()
    t.check(proxy.poll() is None, "the proxy lives on", tail())
    proxy.terminate()
    proxy.wait(10)
    t.done()


if __name__ == "__main__":
    main()
