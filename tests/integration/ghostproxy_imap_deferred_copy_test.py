#!/usr/bin/env python3
"""ghostproxy defers COPY/UID COPY and APPEND (proxy/imap_proxy.h "Deferred changes") in front of a
real dovecot on 127.0.0.1, with a ghostfs whose emulated network card sleeps in PSM: while the
card is low, a COPY to another mailbox and an APPEND (imaplib with a synchronizing literal, curl
imap:// upload, a LITERAL+ one) are answered OK at once, without COPYUID/APPENDUID, and nothing
reaches dovecot (a client logging in again does not send the queue); a MULTIAPPEND is refused
whole; `ghostctl flush` sends the queue, after which dovecot (checked directly) has the copies
and the appended messages byte-identical, with their flags and date; a STATUS of a destination
with a queued copy sends the queue first; a COPY into the selected mailbox goes to the server at
once; a SIGKILL of the proxy with a COPY and an APPEND queued loses neither after a restart.
TAP; skipped without root, /dev/fuse, dovecot or nginx."""
import imaplib
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 12


def message(subject, seed):
    return (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n"
            f"Message-ID: <{subject}.{seed}@ghost>\r\n\r\nbody {seed}\r\nline two\r\n").encode()


def main():
    originals = [message(f"m{i}", i) for i in range(4)]
    t, dc, imap = h.held_mail(PLAN, originals)
    iport, start, tail, work, ctl = imap.port, imap.start, imap.tail, imap.work, imap.ctl
    ghostctl = os.path.join(h.build_dir(), "fs", "ghostctl")
    direct, server_messages, bodies = dc.login, dc.messages, dc.bodies

    d = direct()
    for box in ("Archive", "Sent"):
        d.create(box)
    d.select("INBOX", readonly=True)
    uids = [int(x) for x in d.uid("SEARCH", None, "ALL")[1][0].split()]
    d.logout()

    proxy = imap.start_checked(t, PLAN)
    time.sleep(1)  # subscribed to ghostfs's modes

    c = imaplib.IMAP4("127.0.0.1", iport)
    c.login(dc.user, dc.password)
    c.select("INBOX")
    typ, data = c.uid("COPY", f"{uids[0]},{uids[1]}", "Archive")
    copyuid = c.response("COPYUID")[1]
    typ2, _ = c.copy("3", "Archive")
    t.check(typ == "OK" and typ2 == "OK" and copyuid == [None] and bodies("Archive") == [],
            "UID COPY and COPY are answered OK at once, without COPYUID, and nothing reaches dovecot",
            f"{typ} {data} {typ2} {copyuid} {len(bodies('Archive'))} " + tail())

    appended = message("appended-imaplib", 100)
    typ, data = c.append("Sent", "(\\Seen $Ghost)", imaplib.Time2Internaldate(1700000000), appended)
    appenduid = c.response("APPENDUID")[1]
    t.check(typ == "OK" and appenduid == [None] and bodies("Sent") == [],
            "APPEND (synchronizing literal) is answered OK at once, without APPENDUID, not at dovecot",
            f"{typ} {data} {appenduid} " + tail())

    # curl's upload is an APPEND with a synchronizing literal, too.
    curl_msg = message("appended-curl", 101)
    upload = os.path.join(work, "curl.eml")
    with open(upload, "wb") as f:
        f.write(curl_msg)
    r = subprocess.run(["curl", "-s", "--max-time", "20", "-u", f"{dc.user}:{dc.password}", "-T", upload,
                        f"imap://127.0.0.1:{iport}/Sent"], capture_output=True, timeout=30)
    t.check(r.returncode == 0 and bodies("Sent") == [], "curl imap:// upload (APPEND) is deferred",
            f"rc {r.returncode} {r.stderr[-300:]} " + tail())

    # A LITERAL+ APPEND and a MULTIAPPEND on a raw connection.
    s = socket.create_connection(("127.0.0.1", iport), timeout=10)
    f = s.makefile("rb")
    f.readline()
    plus_msg = message("appended-literal-plus", 102)
    s.sendall(f'a1 LOGIN {dc.user} "{dc.password}"\r\n'.encode())
    h.imap_read_until(f, b"a1")
    s.sendall(b"a2 APPEND Sent {%d+}\r\n" % len(plus_msg) + plus_msg + b"\r\n")
    plus = h.imap_read_until(f, b"a2")
    s.sendall(b"a3 APPEND Sent {5+}\r\nhello {5+}\r\nworld\r\n")
    multi = h.imap_read_until(f, b"a3")
    s.sendall(b"a4 LOGOUT\r\n")
    s.close()
    plus_ok = b"a2 OK" in plus
    t.check(plus_ok and b"a3 NO" in multi and bodies("Sent") == [],
            "a LITERAL+ APPEND is deferred; a MULTIAPPEND is refused whole", f"{plus} {multi} " + tail())

    # ghostctl flush sends the queue; dovecot has every message byte-identical, with flags.
    subprocess.run([ghostctl, "--control", ctl, "flush"], capture_output=True, timeout=30)
    want_sent = sorted([appended, curl_msg, plus_msg])
    h.wait_for(lambda: bodies("Sent") == want_sent or None, timeout=10)
    t.check(bodies("Archive") == sorted(originals[:3]),
            "after ghostctl flush dovecot's Archive has the three copies, byte-identical", bodies("Archive"))
    sent = server_messages("Sent")
    t.check(sorted(b for _, b in sent) == want_sent,
            "after ghostctl flush dovecot's Sent has the three appended messages, byte-identical",
            f"{[b[:60] for _, b in sent]} " + tail())
    flags = {b: fl for fl, b in sent}
    d = direct()
    d.select("Sent", readonly=True)
    dates = d.uid("FETCH", "1:*", "(INTERNALDATE BODY.PEEK[HEADER.FIELDS (SUBJECT)])")[1]
    d.logout()
    dated = [x[0] for x in dates if isinstance(x, tuple) and b"appended-imaplib" in x[1]]
    t.check("\\Seen" in flags.get(appended, []) and "$Ghost" in flags.get(appended, []) and
            dated and b"14-Nov-2023" in dated[0],
            "the deferred APPEND keeps its flags and its date", f"{flags.get(appended)} {dated}")

    # STATUS of a mailbox with a queued copy sends the queue first, then answers.
    typ, _ = c.uid("COPY", str(uids[2]), "Archive")
    queued = len(bodies("Archive")) == 3
    typ, data = c.status("Archive", "(MESSAGES)")
    t.check(queued and typ == "OK" and b"MESSAGES 4" in data[0] and len(bodies("Archive")) == 4,
            "STATUS of the destination sends the queued copy first and counts it", f"{data} " + tail())

    # A COPY into the selected mailbox is not deferred: dovecot has it at once.
    typ, _ = c.copy("1", "INBOX")
    t.check(typ == "OK" and len(bodies("INBOX")) == 5, "a COPY into the selected mailbox goes to dovecot at once",
            tail())
    c.logout()

    # SIGKILL with a COPY and an APPEND queued: both land after the restart and a login.
    c = imaplib.IMAP4("127.0.0.1", iport)
    c.login(dc.user, dc.password)
    c.select("INBOX")
    typ, _ = c.uid("COPY", str(uids[3]), "Archive")
    late = message("appended-before-kill", 103)
    typ2, _ = c.append("Sent", None, None, late)
    proxy.kill()
    proxy.wait(10)
    t.check(typ == "OK" and typ2 == "OK" and len(bodies("Archive")) == 4 and late not in bodies("Sent"),
            "a COPY and an APPEND are queued when the proxy is killed", tail())
    proxy = start()
    h.wait_port(iport, 15)
    time.sleep(1)
    c = imaplib.IMAP4("127.0.0.1", iport)
    c.login(dc.user, dc.password)
    landed = h.wait_for(lambda: (originals[3] in bodies("Archive") and late in bodies("Sent")) or None, timeout=10)
    c.logout()
    t.check(landed and bodies("Archive") == sorted(originals + [originals[2]]) and
            bodies("Sent") == sorted(want_sent + [late]),
            "after a SIGKILL and a restart the queued COPY and APPEND reach dovecot, once each", tail())
    proxy.terminate()
    proxy.wait(10)
    t.done()


if __name__ == "__main__":
    main()
