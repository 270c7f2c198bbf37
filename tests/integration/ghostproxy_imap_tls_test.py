#!/usr/bin/env python3
"""ghostproxy's IMAP proxy with TLS toward clients (--imap-tls-cert/--imap-tls-key,
--imaps-listen, STARTTLS on the plain listener), in front of a real dovecot on 127.0.0.1, its
cache in a real ghostfs mount. A self-signed certificate is made here (openssl req). Python
imaplib IMAP4_SSL and IMAP4.starttls(), curl imaps:// and curl imap:// --ssl-reqd verify it
with --cacert and get bodies byte-identical to dovecot's, from the server and from the cache;
a client sending garbage instead of a handshake is closed and the proxy serves on; plaintext
pipelined after STARTTLS is dropped, not run; STARTTLS after login is refused; a key that does
not match the certificate stops ghostproxy with a message naming it. TAP; skipped without root,
/dev/fuse, dovecot or openssl."""
import imaplib
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 13


def message(subject, size, seed):
    head = (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n"
            f"Message-ID: <{subject}.{seed}@ghost>\r\n\r\n")
    body, i = [], 0
    while len(head) + sum(map(len, body)) < size:
        body.append(f"{seed:02d} line {i:06d} " + "y" * 50 + "\r\n")
        i += 1
    return (head + "".join(body)).encode()


def make_cert(work, name):
    """A self-signed certificate for 127.0.0.1 and localhost: (cert, key)."""
    cert, key = os.path.join(work, name + ".pem"), os.path.join(work, name + ".key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def start_proxy(mnt, ctl, origin, extra):
    port, iport, sport = h.free_port(), h.free_port(), h.free_port()
    exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
    cmd = [exe, "--listen", f"127.0.0.1:{port}", "--mount", mnt, "--control", ctl,
           "--imap-listen", f"127.0.0.1:{iport}", "--imaps-listen", f"127.0.0.1:{sport}",
           "--imap-origin", origin, *extra]
    log = open(os.path.join(h.tempdir("ghost-log-"), "ghostproxy.log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    h.on_exit(lambda: p.poll() is None and (p.terminate(), p.wait(10)))
    return p, iport, sport, log.name


def main():
    h.require_root_and_fuse()
    if not shutil.which("openssl"):
        h.skip_all("openssl is not installed")
    dc = h.started_dovecot()
    t = h.Tap(PLAN)
    sent = [message("tls-small", 4000, 1), message("tls-large", 600 * 1024, 2)]
    for m in sent:
        dc.seed("", m)
    work = h.tempdir()
    cert, key = make_cert(work, "proxy")
    _, other_key = make_cert(work, "other")
    _, mnt, ctl = h.mount_origin(t, PLAN, work, {})
    origin = f"imap://127.0.0.1:{dc.port}/"
    proxy, iport, sport, plog = start_proxy(mnt, ctl, origin,
                                            ["--imap-tls-cert", cert, "--imap-tls-key", key])
    if not t.check(h.wait_port(iport, 15) and h.wait_port(sport, 15),
                   "ghostproxy listens for IMAP and IMAPS with a certificate", open(plog).read()):
        t.skip_rest(PLAN, "no IMAP proxy")
        t.done()

    d = imaplib.IMAP4("127.0.0.1", dc.port)
    d.login(dc.user, dc.password)
    d.select("INBOX", readonly=True)
    uids = d.uid("SEARCH", None, "ALL")[1][0].split()
    direct = {u: d.uid("FETCH", u, "(BODY.PEEK[])")[1][0][1] for u in uids}
    d.logout()
    u_small, u_large = uids[0], uids[1]
    ctx = ssl.create_default_context(cafile=cert)

    # STARTTLS on the plain (loopback) listener: offered, and logins allowed before it.
    c = imaplib.IMAP4("127.0.0.1", iport)
    before = [x.upper() for x in c.capabilities]
    typ, _ = c.starttls(ssl_context=ctx)
    c.capabilities = None
    after = [x.upper() for x in c.capability()[1][0].decode().split()]
    c.login(dc.user, dc.password)
    c.select("INBOX", readonly=True)
    data = c.uid("FETCH", u_small, "(BODY.PEEK[])")[1][0][1]
    c.logout()
    t.check("STARTTLS" in before and "LOGINDISABLED" not in before and typ == "OK"
            and "STARTTLS" not in after and data == direct[u_small],
            "imaplib starttls(): offered on the loopback listener, verified, the body is dovecot's",
            f"{before} -> {after}")

    # Implicit TLS: IMAP4_SSL verifies the certificate; a large body from the server, then
    # from the cache, over TLS.
    def fetch_ssl(uid):
        c = imaplib.IMAP4_SSL("127.0.0.1", sport, ssl_context=ctx)
        caps = [x.upper() for x in c.capabilities]
        c.login(dc.user, dc.password)
        c.select("INBOX", readonly=True)
        typ, data = c.uid("FETCH", uid, "(BODY.PEEK[])")
        c.logout()
        return caps, typ, data

    caps, typ, data = fetch_ssl(u_large)
    t.check(typ == "OK" and data[0][1] == direct[u_large] and "STARTTLS" not in caps,
            "imaplib IMAP4_SSL on --imaps-listen: a 600 KB body byte-identical to dovecot's", caps)

    # imaplib drops the tagged line's text; read it raw instead.
    def cached_raw():
        raw = socket.create_connection(("127.0.0.1", sport), timeout=20)
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        f = s.makefile("rb")
        f.readline()
        s.sendall(f'l1 LOGIN {dc.user} "{dc.password}"\r\ns1 EXAMINE INBOX\r\n'.encode())
        h.imap_read_until(f, b"s1 ")
        s.sendall(b"f1 UID FETCH " + u_large + b" BODY.PEEK[]\r\n")
        out = h.imap_read_until(f, b"f1 ")
        s.sendall(b"z LOGOUT\r\n")
        s.close()
        return out if b"from the cache" in out else None
    raw = h.wait_for(cached_raw, timeout=20)
    body = b""
    if raw:
        head, _, rest = raw.partition(b"}\r\n")
        body = rest[:int(head.rsplit(b"{", 1)[1])]
    t.check(bool(raw) and body == direct[u_large],
            "over TLS, the body is answered from the cache the second time, byte-identical",
            (raw or b"")[-200:])

    # curl: imaps:// and imap:// with STARTTLS required, --cacert.
    for scheme, port, extra, what in (("imaps", sport, [], "curl imaps:// --cacert"),
                                       ("imap", iport, ["--ssl-reqd"], "curl imap:// --ssl-reqd (STARTTLS)")):
        out = subprocess.run(["curl", "-s", "--max-time", "20", "--cacert", cert, *extra,
                              "-u", f"{dc.user}:{dc.password}",
                              f"{scheme}://127.0.0.1:{port}/INBOX;UID={u_small.decode()}"],
                             capture_output=True, timeout=30)
        t.check(out.returncode == 0 and out.stdout == direct[u_small], what + ": the body is dovecot's",
                f"rc {out.returncode} {len(out.stdout)} bytes {out.stderr[-300:]}")

    # A client that does not trust the certificate fails the handshake (nothing is served).
    try:
        imaplib.IMAP4_SSL("127.0.0.1", sport, ssl_context=ssl.create_default_context()).logout()
        refused = False
    except ssl.SSLError:
        refused = True
    t.check(refused, "a client without the CA refuses the proxy's certificate")

    # Garbage instead of a ClientHello: a clean close, and the proxy serves others.
    s = socket.create_connection(("127.0.0.1", sport), timeout=10)
    s.sendall(b"a1 LOGIN not a handshake\r\n" * 20)
    t0, got, closed = time.time(), b"", False
    try:
        while time.time() - t0 < 10:
            chunk = s.recv(4096)
            if not chunk:
                closed = True
                break
            got += chunk
    except ConnectionResetError:
        closed = True
    except OSError:
        pass
    s.close()
    t.check(closed and time.time() - t0 < 10 and b"OK" not in got,
            "garbage instead of a TLS handshake is closed at once", got[:200])
    caps, typ, data = fetch_ssl(u_small)
    t.check(proxy.poll() is None and typ == "OK" and data[0][1] == direct[u_small],
            "and the proxy serves the next TLS client", open(plog).read()[-400:])

    # Plaintext pipelined behind STARTTLS is dropped (CVE-2011-0411), not run under TLS.
    raw = socket.create_connection(("127.0.0.1", iport), timeout=15)
    f = raw.makefile("rb")
    f.readline()
    raw.sendall(b"a1 STARTTLS\r\na2 LOGIN injected nothing\r\n")
    ok_line = f.readline()
    s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    f = s.makefile("rb")
    s.sendall(b"a3 NOOP\r\n")
    got = h.imap_read_until(f, b"a3 ")
    s.close()
    t.check(ok_line.startswith(b"a1 OK") and b"a2" not in got and got.startswith(b"a3 OK"),
            "a command pipelined in clear behind STARTTLS is dropped", ok_line + got)

    # STARTTLS after login is refused; the session goes on in clear.
    raw = socket.create_connection(("127.0.0.1", iport), timeout=15)
    f = raw.makefile("rb")
    f.readline()
    raw.sendall(f'l1 LOGIN {dc.user} "{dc.password}"\r\n'.encode())
    login = h.imap_read_until(f, b"l1 ")
    raw.sendall(b"a1 STARTTLS\r\na2 NOOP\r\n")
    got = h.imap_read_until(f, b"a2 ")
    raw.close()
    t.check(login.startswith(b"l1 OK") and b"a1 BAD" in got and b"a2 OK" in got
            and b"STARTTLS" not in login.split(b"]")[0],
            "STARTTLS after login is refused (and no longer offered)", login + got)

    # A key that is not the certificate's.
    bad = subprocess.run([os.path.join(h.build_dir(), "proxy", "ghostproxy"), "--listen",
                          f"127.0.0.1:{h.free_port()}", "--mount", mnt, "--control", ctl,
                          "--imap-listen", f"127.0.0.1:{h.free_port()}", "--imap-origin", origin,
                          "--imap-tls-cert", cert, "--imap-tls-key", other_key],
                         capture_output=True, text=True, timeout=30)
    code, err = bad.returncode, bad.stderr
    t.check(code == 2 and "--imap-tls-key" in err and ("does not match" in err or "mismatch" in err),
            "a key that does not match the certificate stops ghostproxy with a message naming it",
            f"rc {code}: {err[-300:]}")

    proxy.terminate()
    proxy.wait(15)
    t.check(proxy.returncode == 0, "ghostproxy exits cleanly after the TLS sessions",
            open(plog).read()[-600:])
    t.done()


if __name__ == "__main__":
    main()
