#!/usr/bin/env python3
"""ghostproxy's IMAP proxy carries what it sends to the server on ghostfs's emulated card, as
its HTTP fetches are (DESIGN §4.3, §7.2): beside a ghostfs with the ipaq-2004's devices (card in
PSM; the modelled link has a 40 ms RTT and four round trips before a first byte), a body fetched
from a dovecot on 127.0.0.1 through the proxy is answered no sooner than the card's modelled
transfer (at least 4 x 40 ms), though dovecot answers directly in a few milliseconds; an APPEND
sent to the server (no journal: not deferred) waits for the card's upload too (the round trips
plus 8 KiB at 256 kb/s); the bytes are dovecot's. TAP; skipped without root, /dev/fuse or
dovecot."""
import imaplib
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 5
# ipaq-2004: round_trips = 4 at 2 x 20 ms; uplink 256 kb/s.
MODELLED_FETCH_S = 4 * 0.040
MODELLED_UPLOAD_S = 4 * 0.040 + 8192 * 8 / 256000


def message(subject, size):
    head = f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n\r\n".encode()
    body = (b"x" * 70 + b"\r\n") * ((size - len(head)) // 72)
    return head + b"y" * (size - len(head) - len(body) - 2) + b"\r\n" + body


def main():
    h.require_root_and_fuse()
    dc = h.started_dovecot()
    big = message("card", 16384)
    dc.seed("", big)
    t = h.Tap(PLAN)
    work = h.tempdir()
    mnt, ctl = h.sleeping_card_mount(t, PLAN, work)
    port = h.free_port()
    log = os.path.join(work, "ghostproxy.log")
    p = subprocess.Popen([os.path.join(h.build_dir(), "proxy", "ghostproxy"),
                          "--listen", f"127.0.0.1:{h.free_port()}", "--mount", mnt, "--control", ctl,
                          "--imap-listen", f"127.0.0.1:{port}", "--imap-origin", f"imap://127.0.0.1:{dc.port}/"],
                         stdout=open(log, "a"), stderr=subprocess.STDOUT)
    h.on_exit(lambda: p.poll() is None and (p.terminate(), p.wait(10)))
    if not t.check(h.wait_port(port, 15), "ghostproxy listens for IMAP beside a ghostfs with emulated devices",
                   open(log).read()[-600:]):
        t.skip_rest(PLAN, "no IMAP proxy")
        t.done()

    d = dc.login()
    d.select("INBOX", readonly=True)
    uid = d.uid("SEARCH", None, "ALL")[1][0].split()[0].decode()
    start = time.monotonic()
    direct = d.uid("FETCH", uid, "(BODY.PEEK[])")[1][0][1]
    direct_s = time.monotonic() - start
    d.logout()

    c = imaplib.IMAP4("127.0.0.1", port)
    c.login(dc.user, dc.password)
    c.select("INBOX")
    c.uid("FETCH", uid, "(FLAGS)")  # the proxy's own round trips (the UID map) before the timing
    start = time.monotonic()
    typ, data = c.uid("FETCH", uid, "(BODY.PEEK[])")
    proxied_s = time.monotonic() - start
    body = data[0][1] if typ == "OK" and isinstance(data[0], tuple) else None
    t.check(body == direct == big, "a body from the server through the proxy is dovecot's, byte for byte",
            (typ, len(body or b""), len(direct)))
    t.check(proxied_s >= MODELLED_FETCH_S,
            f"the fetch waits for the emulated card's transfer (>= {MODELLED_FETCH_S * 1000:.0f} ms)",
            f"through the proxy {proxied_s * 1000:.1f} ms, dovecot directly {direct_s * 1000:.1f} ms")

    c.create("Sent")
    sent = message("sent", 8192)
    start = time.monotonic()
    typ, data = c.append("Sent", None, None, sent)
    append_s = time.monotonic() - start
    t.check(typ == "OK" and dc.bodies("Sent") == [sent], "an APPEND through the proxy reaches dovecot at once",
            (typ, data))
    t.check(append_s >= MODELLED_UPLOAD_S,
            f"the APPEND waits for the emulated card's upload (>= {MODELLED_UPLOAD_S * 1000:.0f} ms)",
            f"{append_s * 1000:.1f} ms")
    c.logout()
    t.done()


if __name__ == "__main__":
    main()
