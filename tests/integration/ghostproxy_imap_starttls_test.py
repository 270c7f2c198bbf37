#!/usr/bin/env python3
"""ghostproxy's IMAP proxy toward an imap:// origin that offers STARTTLS (--imap-origin
imap://HOST:PORT/, --imap-origin-starttls): a real dovecot on 127.0.0.1 with a certificate made
here by openssl (harness Dovecot(tls=True)), the proxy's cache in a real ghostfs mount.
Python imaplib logs in and fetches a body through the proxy: byte-identical to dovecot's, and
dovecot's log says the login came over TLS; the client sees neither the server's STARTTLS nor
its pre-TLS capabilities. Without the CA trusted the session ends with a BYE naming the
certificate. With "required", a server offering no STARTTLS (a plain dovecot) gets a clear BYE;
with the default, the same server is used in clear (loopback). Bad servers (scripted here): one
that sends bytes after STARTTLS's OK (injection), one that says OK and then sends garbage
instead of a handshake, one that refuses STARTTLS, one that sends no IMAP greeting: each gets a
BYE naming the fault, and the proxy serves on. TAP; skipped without root, /dev/fuse, dovecot or
openssl."""
import imaplib
import os
import shutil
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 13


def message(subject, size):
    head = (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n"
            f"Message-ID: <{subject}@ghost>\r\n\r\n")
    body, i = [], 0
    while len(head) + sum(map(len, body)) < size:
        body.append(f"line {i:06d} " + "z" * 60 + "\r\n")
        i += 1
    return (head + "".join(body)).encode()


def start_proxy(work, mnt, ctl, origin, extra=(), env=None):
    port = h.free_port()
    exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
    log = os.path.join(h.tempdir("ghost-log-"), "ghostproxy.log")
    p = subprocess.Popen([exe, "--listen", f"127.0.0.1:{h.free_port()}", "--mount", mnt, "--control", ctl,
                          "--imap-listen", f"127.0.0.1:{port}", "--imap-origin", origin, *extra],
                         stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    h.on_exit(lambda: p.poll() is None and (p.terminate(), p.wait(10)))
    return p, port, log


def greeting_of(port):
    """The proxy's first words to a new client (everything until it closes or says a line)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=15)
    f = s.makefile("rb")
    out = f.readline()
    if out.startswith(b"* OK"):
        s.sendall(b"z LOGOUT\r\n")
    s.close()
    return out


def scripted_server(script):
    """A one-connection-at-a-time server on 127.0.0.1 that runs `script(conn, reader)` for each
    connection; returns its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            try:
                conn.settimeout(10)
                script(conn, conn.makefile("rb"))
            except OSError:
                pass
            finally:
                conn.close()
    threading.Thread(target=serve, daemon=True).start()
    h.on_exit(srv.close)
    return srv.getsockname()[1]


def starttls_script(after_ok):
    """A server offering STARTTLS whose answer to it is `after_ok(tag)` (bytes)."""
    def script(conn, f):
        conn.sendall(b"* OK [CAPABILITY IMAP4rev1 STARTTLS AUTH=PLAIN] fake ready\r\n")
        while True:
            line = f.readline()
            if not line:
                return
            tag, _, cmd = line.partition(b" ")
            if cmd.strip().upper() == b"STARTTLS":
                conn.sendall(after_ok(tag))
                f.read(1)  # until the proxy gives up
                return
            conn.sendall(tag + b" BAD unexpected\r\n")
    return script


def garbage_handshake(conn, f):
    """STARTTLS offered and answered OK, then (once the proxy's ClientHello arrives) bytes that
    are not TLS."""
    conn.sendall(b"* OK [CAPABILITY IMAP4rev1 STARTTLS] fake\r\n")
    line = f.readline()
    conn.sendall(line.split(b" ")[0] + b" OK begin TLS\r\n")
    conn.recv(1)
    conn.sendall(b"\x00garbage, not a TLS record\r\n" * 4)
    f.read(1)


def main():
    h.require_root_and_fuse()
    if not shutil.which("openssl"):
        h.skip_all("openssl is not installed (the test certificate)")
    dc = h.started_dovecot(tls=True)
    t = h.Tap(PLAN)
    sent = message("starttls", 40 * 1024)
    dc.seed("", sent)
    work = h.tempdir()
    fs, mnt, ctl = h.mount_origin(t, PLAN, work, {})
    trusted = dict(os.environ, SSL_CERT_FILE=dc.ca_file)
    origin = f"imap://127.0.0.1:{dc.port}/"
    proxy, port, plog = start_proxy(work, mnt, ctl, origin, ["--imap-origin-starttls", "required"], env=trusted)
    if not t.check(h.wait_port(port, 15), "ghostproxy listens, its origin imap:// with STARTTLS required",
                   open(plog).read()[-500:]):
        t.skip_rest(PLAN, "no IMAP proxy")
        t.done()

    # 1. Login and a FETCH through the STARTTLS upstream.
    body, caps, err = None, [], ""
    try:
        c = imaplib.IMAP4("127.0.0.1", port)
        caps = [x.upper() for x in c.capabilities]
        c.login(dc.user, dc.password)
        c.select("INBOX", readonly=True)
        uid = c.uid("SEARCH", None, "ALL")[1][0].split()[0]
        body = c.uid("FETCH", uid, "(BODY.PEEK[])")[1][0][1]
        c.logout()
    except Exception as e:  # noqa: BLE001 - reported below
        err = repr(e)
    t.check(body == sent, "LOGIN and UID FETCH BODY.PEEK[] through a STARTTLS upstream: dovecot's bytes",
            err + open(plog).read()[-500:])
    logins = [ln for ln in dc.log().splitlines() if "imap-login:" in ln and "Login: user=" in ln]
    t.check(bool(logins) and all(", TLS" in ln for ln in logins),
            "dovecot saw the proxy's login over TLS (STARTTLS on its plain port)", "\n".join(logins[-3:]))
    t.check("IMAP4REV1" in caps and "STARTTLS" not in caps,
            "the client sees the server's capabilities without its STARTTLS", caps)

    # 2. The CA not trusted: a clear BYE naming the certificate; nothing in clear.
    p2, port2, plog2 = start_proxy(work, mnt, ctl, origin, env=dict(os.environ, SSL_CERT_FILE="/nonexistent"))
    h.wait_port(port2, 15)
    g = greeting_of(port2)
    t.check(g.startswith(b"* BYE") and b"certificate" in g,
            "an untrusted server certificate after STARTTLS: the client gets a BYE naming it", g)
    logins_before = len(logins)
    t.check(len([ln for ln in dc.log().splitlines() if "imap-login:" in ln and "Login: user=" in ln]) == logins_before,
            "... and no login reached the server", dc.log()[-300:])

    # 3. "required" against a server without STARTTLS (a plain dovecot): a clear BYE.
    plain = h.started_dovecot()
    plain.seed("", sent)
    porigin = f"imap://127.0.0.1:{plain.port}/"
    p3, port3, plog3 = start_proxy(work, mnt, ctl, porigin, ["--imap-origin-starttls", "required"], env=trusted)
    h.wait_port(port3, 15)
    g = greeting_of(port3)
    t.check(g.startswith(b"* BYE") and b"does not offer STARTTLS" in g,
            "STARTTLS required, the server offers none: a BYE saying so", g + open(plog3).read()[-300:].encode())
    # ... and with the default (if-offered), the same loopback server is used in clear.
    p4, port4, plog4 = start_proxy(work, mnt, ctl, porigin, env=trusted)
    h.wait_port(port4, 15)
    body4, err = None, ""
    try:
        c = imaplib.IMAP4("127.0.0.1", port4)
        c.login(plain.user, plain.password)
        c.select("INBOX", readonly=True)
        uid = c.uid("SEARCH", None, "ALL")[1][0].split()[0]
        body4 = c.uid("FETCH", uid, "(BODY.PEEK[])")[1][0][1]
        c.logout()
    except Exception as e:  # noqa: BLE001 - reported below
        err = repr(e)
    t.check(body4 == sent, "STARTTLS if offered, none offered by a loopback server: plain text works",
            err + open(plog4).read()[-300:])

    # 4. Bad servers.
    bad = [
        ("injection", starttls_script(lambda tag: tag + b" OK begin TLS\r\n* OK injected\r\n"),
         b"after STARTTLS's OK", "bytes after STARTTLS's OK (injection) are refused"),
        ("garbage", garbage_handshake, b"STARTTLS failed", "garbage instead of a TLS handshake"),
        ("refused", starttls_script(lambda tag: tag + b" NO not now\r\n"),
         b"refused STARTTLS", "a server refusing STARTTLS"),
        ("no greeting", lambda conn, f: (conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"), f.read(1)),
         b"no IMAP greeting", "a server that sends no IMAP greeting"),
    ]
    results = []
    for name, script, want, what in bad:
        fport = scripted_server(script)
        pb, portb, plogb = start_proxy(work, mnt, ctl, f"imap://127.0.0.1:{fport}/",
                                       ["--imap-origin-starttls", "required"], env=trusted)
        h.wait_port(portb, 15)
        g = greeting_of(portb)
        results.append((what, g))
    t.check(all(r[1].startswith(b"* BYE") for r in results) and
            all(want in r[1] for r, (_, _, want, _) in zip(results, bad)),
            "bad STARTTLS servers (injection, garbage handshake, refusal, no greeting): a BYE naming each",
            results)
    t.check(proxy.poll() is None and all(p.poll() is None for p in (p2, p3, p4)),
            "every proxy is still up", open(plog).read()[-300:])
    # The failures are logged with the origin.
    t.check("does not offer STARTTLS" in open(plog3).read() and "certificate" in open(plog2).read(),
            "the proxy's log names each failure", open(plog2).read()[-300:] + open(plog3).read()[-300:])
    # A bad value of the option stops ghostproxy with a message naming it.
    exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
    r = subprocess.run([exe, "--listen", f"127.0.0.1:{h.free_port()}", "--mount", mnt, "--control", ctl,
                        "--imap-listen", f"127.0.0.1:{h.free_port()}", "--imap-origin", origin,
                        "--imap-origin-starttls", "maybe"], capture_output=True, text=True, timeout=15)
    t.check(r.returncode == 2 and "if-offered" in r.stderr, "--imap-origin-starttls maybe: usage error naming the values",
            f"rc {r.returncode} {r.stderr[-300:]}")
    t.check(fs.proc.poll() is None, "ghostfs is still up", fs.output()[-300:])
    t.done()


if __name__ == "__main__":
    main()
