#!/usr/bin/env python3
"""What a client is told while the proxy defers a MOVE and other clients add messages at
dovecot (proxy/imap_proxy.cc: the map refresh, TranslateUntagged). Another client APPENDs
before the client's UID MOVE of 2 of 5: the proxy reads the mailbox's map first (its own UID
SEARCH), which dovecot answers from the view of its last sync and follows with EXISTS 6 for the
new message; the map must not be taken without it (FETCH 1:* then numbers the client's 4
messages, the new one last; round 17's seed 841362 of ghostproxy_imap_random lost it). Another
APPEND while the 2 are hidden: the client's NOOP (passed on) brings dovecot's EXISTS 7, which
counts the hidden messages; the client must be told EXISTS 5, its own 4 and the new one. After
`ghostctl flush` no EXPUNGE reaches it, its count stays 5, and dovecot holds exactly those 5.
Untagged EXISTS and EXPUNGE are checked in the order they came (h.OrderedIMAP4).
TAP; skipped without root, /dev/fuse, dovecot or nginx."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 7


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
    d.create("Archive")
    d.logout()

    proxy = imap.start_checked(t, PLAN)
    time.sleep(1)  # subscribed to ghostfs's modes

    c = h.OrderedIMAP4("127.0.0.1", imap.port)
    c.login(dc.user, dc.password)
    c.select("INBOX")
    c.uid("FETCH", "1:*", "(FLAGS)")  # the proxy learns the flags
    c.events.clear()

    def another_append(subject):
        """Another client's APPEND at dovecot: (its answer, the new message's bytes and UID)."""
        new = message(subject)
        d = dc.login()
        typ, data = d.append("INBOX", None, None, new)
        d.select("INBOX", readonly=True)
        uid = max(int(x) for x in d.uid("SEARCH", None, "ALL")[1][0].split())
        d.logout()
        return f"{typ} {data}", new, uid

    def count(events, start):
        """The client's count after `events` (EXISTS and EXPUNGE in order) from `start`."""
        for kind, n in events:
            start = n if kind == "EXISTS" else start - 1
        return start

    def taken():
        """The untagged EXISTS and EXPUNGE since the last call, in order."""
        events = list(c.events)
        c.events.clear()
        return events

    def view():
        typ, data = c.fetch("1:*", "(UID)")
        out = []
        for item in data:
            text = (item if isinstance(item, bytes) else item[0]).decode()
            if "UID " in text:
                out.append((int(text.split()[0]), int(text.split("UID ")[1].split()[0].rstrip(")"))))
        return typ, out

    def check_view(left, name):
        """FETCH 1:* (UID) must number `left` 1..n and leave the client's count at n."""
        typ, seen = view()
        events = taken()
        want = list(enumerate(left, 1))
        t.check(typ == "OK" and seen == want and count(events, len(left)) == len(left), name,
                f"{typ} {seen}, expected {want}; untagged {events} " + imap.tail())

    # A message arrives before the MOVE: the proxy reads the mailbox's map first (its own UID
    # SEARCH), which dovecot answers from the view of its last sync, announcing the new message
    # (EXISTS 6) only after that answer.
    appended_a, new_a, uid_a = another_append("hidden-a")
    typ, data = c._simple_command("UID", "MOVE", f"{uids[1]},{uids[3]}", "Archive")
    events = taken()
    t.check(typ == "OK" and b"deferred" in data[0] and [e for e in events if e[0] == "EXPUNGE"] ==
            [("EXPUNGE", 4), ("EXPUNGE", 2)] and count(events, 5) == 4 and len(dc.bodies("INBOX")) == 6,
            "UID MOVE of 2 of 5 is deferred after another client's APPEND: the client is told EXPUNGE 4 and 2 "
            "and the new message, 4 in all; dovecot still has 6",
            f"APPEND {appended_a}; UID MOVE {typ} {data}, untagged in order {events}; "
            f"dovecot {len(dc.bodies('INBOX'))} " + imap.tail())
    left = [uids[0], uids[2], uids[4], uid_a]
    check_view(left, "FETCH 1:* (UID) numbers the client's 4 messages 1..4, the new one last (the proxy's map holds it)")

    # Another message arrives while the 2 are hidden: the client's NOOP (passed on) brings
    # dovecot's EXISTS 7, which counts the hidden 2.
    appended_b, new_b, uid_b = another_append("hidden-b")
    typ, _ = c.noop()
    events = taken()
    t.check(typ == "OK" and events == [("EXISTS", 5)],
            "with 2 messages hidden, another client's APPEND is announced to the client as EXISTS 5 "
            "(its 4 and the new one; dovecot has 7)",
            f"APPEND {appended_b}; NOOP {typ}, untagged in order {events} (dovecot: {len(dc.bodies('INBOX'))}) "
            + imap.tail())
    left.append(uid_b)
    check_view(left, "FETCH 1:* (UID) numbers the client's 5 messages 1..5")

    subprocess.run([ghostctl, "--control", imap.ctl, "flush"], capture_output=True, timeout=30)
    flushed = h.wait_for(lambda: len(dc.bodies("INBOX")) == 5 or None, timeout=15)
    typ, _ = c.noop()
    typ2, seen = view()
    events = taken()
    t.check(bool(flushed) and typ == "OK" and count(events, 5) == 5 and seen == list(enumerate(left, 1)) and
            sorted(dc.bodies("INBOX")) == sorted([originals[0], originals[2], originals[4], new_a, new_b]) and
            sorted(dc.bodies("Archive")) == sorted([originals[1], originals[3]]),
            "after ghostctl flush dovecot holds exactly the client's 5 (and the 2 in Archive); no EXPUNGE reaches "
            "the client, its count stays 5",
            f"dovecot {len(dc.bodies('INBOX'))}; untagged in order {events}; view {seen} " + imap.tail())
    c.logout()
    t.check(proxy.poll() is None, "the proxy lives on", imap.tail())
    t.done()


if __name__ == "__main__":
    main()
