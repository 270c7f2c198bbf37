#!/usr/bin/env python3
"""The count a client is told while some of its messages are hidden (proxy/imap_proxy.cc
TranslateUntagged: expunges it was told of, waiting in the deferred queue, dovecot still holding
the messages): another client APPENDs to the mailbox at dovecot, and the client's NOOP (passed
on while messages are hidden) brings dovecot's EXISTS, which counts the hidden messages too. The
client must be told its own count plus the new message (EXISTS 4 after 2 of 5 were expunged),
not dovecot's (6); FETCH 1:* (UID) then numbers the 4 it has 1..4; after `ghostctl flush` no
EXPUNGE reaches it and its count stays 4, and dovecot holds exactly those 4. The untagged EXISTS
and EXPUNGE are checked in the order they came (h.OrderedIMAP4). The random test
(ghostproxy_imap_random) seldom has an EXISTS arrive while messages are hidden: this forces it.
TAP; skipped without root, /dev/fuse, dovecot or nginx."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 6


def message(subject):
    return (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n"
            f"Message-ID: <{subject}@ghost>\r\n\r\nbody of {subject}\r\n").encode()


def main():
    originals = [message(f"hidden{i}") for i in range(5)]
    t, dc, imap = h.held_mail(PLAN, originals)
    ghostctl = os.path.join(h.build_dir(), "fs", "ghostctl")
    d = dc.login()
    d.select("INBOX")
    uids = [int(x) for x in d.uid("SEARCH", None, "ALL")[1][0].split()]
    # \Deleted set at dovecot (a queued flag change would make the EXPUNGE send the queue first).
    d.uid("STORE", f"{uids[1]},{uids[3]}", "+FLAGS.SILENT", "(\\Deleted)")
    d.logout()

    proxy = imap.start_checked(t, PLAN)
    time.sleep(1)  # subscribed to ghostfs's modes

    c = h.OrderedIMAP4("127.0.0.1", imap.port)
    c.login(dc.user, dc.password)
    c.select("INBOX")
    c.uid("FETCH", "1:*", "(FLAGS)")  # the proxy learns the flags
    c.events.clear()
    typ, data = c._simple_command("EXPUNGE")
    events = list(c.events)
    t.check(typ == "OK" and b"deferred" in data[0] and events == [("EXPUNGE", 4), ("EXPUNGE", 2)] and
            len(dc.bodies("INBOX")) == 5,
            "EXPUNGE of 2 of 5 is deferred: the client is told EXPUNGE 4 and 2, dovecot still has 5",
            f"{typ} {data} {events} {len(dc.bodies('INBOX'))} " + imap.tail())
    left = [uids[0], uids[2], uids[4]]

    # Another client's APPEND at dovecot, while the 2 are hidden from this client.
    new = message("hidden-new")
    d = dc.login()
    typ_a, data_a = d.append("INBOX", None, None, new)
    d.select("INBOX", readonly=True)
    new_uid = max(int(x) for x in d.uid("SEARCH", None, "ALL")[1][0].split())
    d.logout()
    c.events.clear()
    typ, _ = c.noop()
    events = list(c.events)
    t.check(typ_a == "OK" and typ == "OK" and events == [("EXISTS", 4)],
            "with 2 messages hidden, another client's APPEND is announced to the client as EXISTS 4 "
            "(its 3 and the new one; dovecot has 6)",
            f"APPEND {typ_a} {data_a}; NOOP {typ}, untagged in order {events} (dovecot: {len(dc.bodies('INBOX'))}) "
            + imap.tail())

    def view():
        typ, data = c.fetch("1:*", "(UID)")
        out = []
        for item in data:
            text = (item if isinstance(item, bytes) else item[0]).decode()
            if "UID " in text:
                out.append((int(text.split()[0]), int(text.split("UID ")[1].split()[0].rstrip(")"))))
        return typ, out
    c.events.clear()
    typ, seen = view()
    events = list(c.events)
    want = list(enumerate(left + [new_uid], 1))
    t.check(typ == "OK" and seen == want and not [e for e in events if e[0] == "EXPUNGE"],
            "FETCH 1:* (UID) numbers the client's 4 messages 1..4, the new one last",
            f"{typ} {seen}, expected {want}; untagged {events} " + imap.tail())

    subprocess.run([ghostctl, "--control", imap.ctl, "flush"], capture_output=True, timeout=30)
    flushed = h.wait_for(lambda: len(dc.bodies("INBOX")) == 4 or None, timeout=15)
    c.events.clear()
    typ, _ = c.noop()
    typ2, seen = view()
    events = list(c.events)
    count = 4
    for kind, n in events:
        count = n if kind == "EXISTS" else count - 1
    t.check(bool(flushed) and typ == "OK" and count == 4 and seen == want and
            sorted(dc.bodies("INBOX")) == sorted([originals[0], originals[2], originals[4], new]),
            "after ghostctl flush dovecot holds exactly the client's 4; no EXPUNGE reaches the client, its count stays 4",
            f"dovecot {len(dc.bodies('INBOX'))}; untagged in order {events} (count {count}); view {seen} "
            + imap.tail())
    c.logout()
    t.check(proxy.poll() is None, "the proxy lives on", imap.tail())
    t.done()


if __name__ == "__main__":
    main()
