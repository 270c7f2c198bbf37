#!/usr/bin/env python3
"""ghostproxy's IMAP proxy answers body sections from the cached whole message
(proxy/imap_section.h): FETCH and UID FETCH of BODY.PEEK[HEADER], [TEXT], [HEADER.FIELDS (..)],
[HEADER.FIELDS.NOT (..)], [n], [n.MIME], [n.TEXT], [n.HEADER], [n.m] and partials of them, for
real multipart messages, and BINARY.PEEK[n], BINARY.SIZE[n] (decoded base64 and quoted-printable) (plain text, a base64 attachment, quoted-printable, nested multipart, a
message/rfc822 part, one written by Python's email package), byte-identical to what a real
dovecot on 127.0.0.1 answers for the same request, and said to be from the cache; sections it
cannot locate for certain (a sub-part of a leaf, a part past the end, BINARY[], a decoded part
with a NUL) go to dovecot and
are byte-identical too; a non-PEEK section fetch from the cache marks the message \\Seen on the
server. TAP; skipped without root, /dev/fuse or dovecot."""
import email.message
import email.policy
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402


def crlf(s):
    return s.replace("\r\n", "\n").replace("\n", "\r\n").encode()


TEXT = crlf("""From: Alice <a@example.org>
To: b@example.org
Subject: plain text
X-Folded: one
\ttwo
Message-ID: <plain@ghost>

Hello Bob,
this is plain text.
""")

BASE64 = crlf("""From: a@example.org
To: b@example.org
Subject: with an attachment
MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="==b64=="

This is a multi-part message in MIME format.
--==b64==
Content-Type: text/plain; charset=utf-8
Content-Transfer-Encoding: 7bit

See the attachment.
--==b64==
Content-Type: application/octet-stream; name="data.bin"
Content-Transfer-Encoding: base64
Content-Disposition: attachment; filename="data.bin"

R2hvc3QgYXR0YWNobWVudDogQVNDSUkgYnl0ZXMsIGJhc2U2NC1lbmNvZGVkLCBvdmVyIHR3byBs
aW5lcyBvZiBiYXNlNjQgdGV4dC4K
--==b64==--
""")

QP = crlf("""From: a@example.org
To: b@example.org
Subject: =?utf-8?q?quoted_printable?=
MIME-Version: 1.0
Content-Type: text/plain; charset=utf-8
Content-Transfer-Encoding: quoted-printable

Caf=C3=A9 cr=C3=A8me br=C3=BBl=C3=A9e, a long line that is soft-broken here=
 and continues.
""")

NESTED = crlf("""From: a@example.org
To: b@example.org
Subject: nested
MIME-Version: 1.0
Content-Type: multipart/mixed;
 boundary=outer-1

--outer-1
Content-Type: multipart/alternative; boundary="inner-2"

--inner-2
Content-Type: text/plain; charset=us-ascii

plain version
--inner-2
Content-Type: text/html; charset=us-ascii

<p>html version</p>
--inner-2--

--outer-1
Content-Type: image/png
Content-Transfer-Encoding: base64

iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==
--outer-1--
epilogue text
""")

RFC822 = crlf("""From: a@example.org
To: b@example.org
Subject: forwarded
MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="fw"

--fw
Content-Type: text/plain

Forwarding this.
--fw
Content-Type: message/rfc822
Content-Disposition: inline

From: c@example.org
To: a@example.org
Subject: the original
MIME-Version: 1.0
Content-Type: multipart/alternative; boundary="orig"

--orig
Content-Type: text/plain

original text
--orig
Content-Type: text/html

<b>original</b>
--orig--
--fw--
""")


def python_made():
    m = email.message.EmailMessage()
    m["From"] = "Python <p@example.org>"
    m["To"] = "b@example.org"
    m["Subject"] = "made by the email package"
    m.set_content("Body text with an accent: \u00e9t\u00e9.\n" * 3)
    m.add_alternative("<p>HTML \u00e9t\u00e9</p>\n", subtype="html")
    m.add_attachment(bytes(range(256)) * 4, maintype="application", subtype="octet-stream",
                     filename="bytes.bin")
    return m.as_bytes(policy=email.policy.SMTP)


FIELDS = "HEADER.FIELDS (From Subject Content-Type)"
# Per message: the sections the proxy answers from the cache, and some it sends on.
CASES = [
    (TEXT, ["HEADER", "TEXT", FIELDS, "HEADER.FIELDS.NOT (Subject X-Folded)", "1", "TEXT<3.10>",
            "HEADER<0.20>", "BINARY.PEEK[1]", "BINARY.SIZE[1]"], ["1.1", "2"]),
    (BASE64, ["HEADER", "TEXT", FIELDS, "1", "1.MIME", "2", "2.MIME", "2<10.30>", "2.MIME<5.100>",
              "BINARY.PEEK[1]", "BINARY.PEEK[2]", "BINARY.SIZE[2]", "BINARY.PEEK[2]<3.7>"],
     ["3", "1.1", "BINARY.PEEK[]"]),
    (QP, ["HEADER", "TEXT", "1", FIELDS, "BINARY.PEEK[1]", "BINARY.SIZE[1]"], ["1.MIME"]),
    (NESTED, ["HEADER", "TEXT", "1", "1.MIME", "1.1", "1.2", "1.1.MIME", "1.2.MIME", "2", "2.MIME",
              "TEXT<0.40>", "BINARY.PEEK[1.1]", "BINARY.SIZE[1.2]"],
     ["1.1.1", "3", "BINARY.PEEK[2]"]),
    (RFC822, ["1", "2", "2.MIME", "2.HEADER", "2.TEXT", "2.1", "2.2", "2.1.MIME",
              "2.HEADER.FIELDS (Subject)", "2.HEADER.FIELDS.NOT (Subject)", "2.TEXT<5.20>"],
     ["1.TEXT", "2.3"]),
    (python_made(), ["HEADER", "TEXT", "1", "1.1", "1.2", "1.1.MIME", "2", "2.MIME", FIELDS,
                     ],
     ["1.3", "BINARY.PEEK[2]", "BINARY.PEEK[1.1]", "BINARY.PEEK[1.2]"]),
]
PLAN = 4 + len(CASES) * 2


class Raw:
    """A raw IMAP session: commands in, every byte of the answer up to the tagged line out."""

    def __init__(self, port, user, password):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.f = self.s.makefile("rb")
        self.f.readline()
        self.n = 0
        self.run(f'LOGIN {user} "{password}"')

    def run(self, command):
        self.n += 1
        tag = f"r{self.n}".encode()
        self.s.sendall(tag + b" " + command.encode() + b"\r\n")
        out = b""
        while True:
            line = self.f.readline()
            if not line:
                return out, b""
            if line.startswith(tag + b" "):
                return out, line
            out += line
            if line.rstrip(b"\r\n").endswith(b"}"):
                out += self.f.read(int(line.rstrip(b"\r\n").rsplit(b"{", 1)[1][:-1]))

    def close(self):
        try:
            self.run("LOGOUT")
        except OSError:
            pass
        self.s.close()


def start_proxy(mnt, ctl, origin):
    port, iport = h.free_port(), h.free_port()
    exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
    cmd = [exe, "--listen", f"127.0.0.1:{port}", "--mount", mnt, "--control", ctl,
           "--imap-listen", f"127.0.0.1:{iport}", "--imap-origin", origin]
    log = open(os.path.join(h.tempdir("ghost-log-"), "ghostproxy.log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    h.on_exit(lambda: p.poll() is None and (p.terminate(), p.wait(10)))
    return p, iport, log.name


def main():
    h.require_root_and_fuse()
    dc = h.started_dovecot()
    t = h.Tap(PLAN)
    for m, _, _ in CASES:
        dc.seed("", m)
    work = h.tempdir()
    _, mnt, ctl = h.mount_origin(t, PLAN, work, {})
    proxy, iport, plog = start_proxy(mnt, ctl, f"imap://127.0.0.1:{dc.port}/")
    if not t.check(h.wait_port(iport, 15), "ghostproxy listens for IMAP", open(plog).read()):
        t.skip_rest(PLAN, "no IMAP proxy")
        t.done()

    d = Raw(dc.port, dc.user, dc.password)
    d.run("EXAMINE INBOX")
    uids = d.run("UID SEARCH ALL")[0].split(b"\r\n")[0].split()[2:]
    t.check(len(uids) == len(CASES), "the messages are in dovecot", uids)
    p = Raw(iport, dc.user, dc.password)
    p.run("EXAMINE INBOX")

    # Each message through the proxy once (the whole body is stored), then until it is a hit.
    for u in uids:
        p.run(f"UID FETCH {u.decode()} BODY.PEEK[]")

    def all_cached():
        return all(b"from the cache" in p.run(f"UID FETCH {u.decode()} BODY.PEEK[]")[1] for u in uids)
    t.check(h.wait_for(all_cached, timeout=20), "every whole message is answered from the cache")

    for (msg, cached, sent_on), u in zip(CASES, uids):
        u = u.decode()
        bad, not_cached = [], []
        for i, sec in enumerate(cached + sent_on):
            # Alternately by UID and by sequence number; "TEXT<3.10>" is BODY.PEEK[TEXT]<3.10>.
            name, _, part = sec.partition("<")
            item = sec if sec.startswith("BINARY") else f"BODY.PEEK[{name}]" + (f"<{part}" if part else "")
            cmd = f"UID FETCH {u} ({item})" if i % 2 == 0 else \
                f"FETCH {uids.index(u.encode()) + 1} {item}"
            want, _ = d.run(cmd)
            got, done = p.run(cmd)
            if got != want or not want:
                bad.append((sec, want[:200], got[:200]))
            if sec in cached and b"from the cache" not in done:
                not_cached.append((sec, done))
        subject = [ln for ln in msg.split(b"\r\n") if ln.startswith(b"Subject:")][0].decode()
        t.check(not bad, f"{subject}: every section through the proxy is byte-identical to dovecot's",
                bad)
        t.check(not not_cached, f"{subject}: {len(cached)} sections answered from the cache",
                not_cached)

    # A non-PEEK section from the cache marks the message \Seen on the server.
    u = uids[3].decode()
    p.run("SELECT INBOX")  # read-write: \Seen can be set
    got, done = p.run(f"UID FETCH {u} BODY[1.1]")

    def seen():
        return b"\\Seen" in dc.uid_flags(u)
    t.check(b"from the cache" in done and b"plain version" in got and h.wait_for(seen, timeout=10),
            "BODY[1.1] (not PEEK) from the cache marks the message \\Seen on dovecot", got + done)
    p.close()
    d.close()
    t.done()


if __name__ == "__main__":
    main()
