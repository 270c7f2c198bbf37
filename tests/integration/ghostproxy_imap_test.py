#!/usr/bin/env python3
"""ghostproxy as an IMAP proxy (proxy/imap_proxy.h) in front of a real dovecot on
127.0.0.1, its cache in a real ghostfs mount that also has the same account as a Maildir
origin: Python imaplib and curl imap:// through the proxy get bodies byte-identical to dovecot's
own; a body fetched once is answered from the cache the next time; a body read through the mount
is a proxy hit; a non-PEEK fetch from the cache still marks the message \\Seen on the server;
LOGIN and AUTHENTICATE PLAIN reach the server; COMPRESS and STARTTLS are filtered out of
CAPABILITY; malformed input (a 1 GB literal, an over-long line, a bad literal size) gets BAD and
a close, and a server hanging mid-literal gets the client a BYE, while the proxy lives on; an
IDLE client costs the proxy no wake-ups. TAP; skipped without root, /dev/fuse or dovecot."""
import imaplib
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 23


def message(subject, size, seed):
    head = (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n"
            f"Message-ID: <{subject}.{seed}@ghost>\r\n\r\n")
    lines, total = [], len(head)
    i = 0
    while total < size:
        line = f"{seed:02d} line {i:06d} " + "x" * 50 + "\r\n"
        lines.append(line)
        total += len(line)
        i += 1
    return (head + "".join(lines)).encode()


def raw_session(port, user, password):
    """A socket logged in through the proxy, and a reader of whole responses up to a tag."""
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    f = s.makefile("rb")
    f.readline()  # greeting
    s.sendall(f'l1 LOGIN {user} "{password}"\r\n'.encode())
    h.imap_read_until(f, b"l1 ")
    return s, f


def fetch_raw(port, dc, command):
    s, f = raw_session(port, dc.user, dc.password)
    s.sendall(b"s1 SELECT INBOX\r\n")
    h.imap_read_until(f, b"s1 ")
    s.sendall(b"f1 " + command + b"\r\n")
    out = h.imap_read_until(f, b"f1 ")
    s.sendall(b"z LOGOUT\r\n")
    s.close()
    return out


def body_of(raw):
    """The literal of the first FETCH response in `raw`."""
    head, _, rest = raw.partition(b"}\r\n")
    n = int(head.rsplit(b"{", 1)[1])
    return rest[:n]


def ctx_switches(pid):
    with open(f"/proc/{pid}/status") as f:
        v = [ln for ln in f if "ctxt_switches" in ln]
    return sum(int(ln.split()[1]) for ln in v)


def hanging_server():
    """A fake IMAP server that greets, logs in, selects, and stops in the middle of a literal."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def session(c):
        try:
            c.sendall(b"* OK [CAPABILITY IMAP4rev1 COMPRESS=DEFLATE ESEARCH] fake\r\n")
            f = c.makefile("rb")
            for line in f:
                tag = line.split(b" ")[0]
                if b"FETCH" in line.upper():
                    c.sendall(b"* 1 FETCH (BODY[] {100}\r\n0123456789")  # and nothing more
                elif b"SELECT" in line.upper():
                    c.sendall(b"* 1 EXISTS\r\n* OK [UIDVALIDITY 7] x\r\n" + tag + b" OK done\r\n")
                else:
                    c.sendall(tag + b" OK done\r\n")
        except OSError:
            pass  # the proxy closed it

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=session, args=(c,), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    h.on_exit(srv.close)
    return srv.getsockname()[1]


def start_proxy(mnt, ctl, origin, extra=(), config=None, env=None):
    port, iport = h.free_port(), h.free_port()
    exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
    cmd = [exe, "--listen", f"127.0.0.1:{port}", "--mount", mnt, "--control", ctl,
           "--imap-listen", f"127.0.0.1:{iport}", "--imap-origin", origin, *extra]
    if config:
        cmd += ["--config", config]
    log = open(os.path.join(h.tempdir("ghost-log-"), "ghostproxy.log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    h.on_exit(lambda: p.poll() is None and (p.terminate(), p.wait(10)))
    return p, iport, log.name


def main():
    h.require_root_and_fuse()
    dc = h.started_dovecot(tls=True)
    t = h.Tap(PLAN)
    sent = [message("small", 3000, 1), message("medium", 300 * 1024, 2),
            message("viamount", 50 * 1024, 3), message("seen", 8000, 4)]
    for m in sent:
        dc.seed("", m)
    work = h.tempdir()
    _, mnt, ctl = h.mount_origin(t, PLAN, work, {"mail": dc.url()},
                                 args=["--password-file", f"mail={dc.password_file()}", "--cacert", dc.ca_file])
    origin = f"imap://127.0.0.1:{dc.port}/"
    # A short imap_timeout: an IDLE session must outlive it (no timer while nothing is owed).
    conf0 = os.path.join(work, "proxy0.toml")
    with open(conf0, "w") as cf:
        cf.write("imap_timeout = 2\nimap_max_line = \"64K\"\n")
    # dovecot offers STARTTLS on its plain port: the proxy takes it (if-offered, the default),
    # trusting the test CA.
    proxy, iport, plog = start_proxy(mnt, ctl, origin, config=conf0, env=dict(os.environ, SSL_CERT_FILE=dc.ca_file))
    if not t.check(h.wait_port(iport, 15), "ghostproxy listens for IMAP with --imap-listen",
                   open(plog).read()):
        t.skip_rest(PLAN, "no IMAP proxy")
        t.done()

    # Direct bodies, for comparison.
    d = imaplib.IMAP4("127.0.0.1", dc.port)
    d.login(dc.user, dc.password)
    d.select("INBOX", readonly=True)
    uids = d.uid("SEARCH", None, "ALL")[1][0].split()
    direct = {u: d.uid("FETCH", u, "(BODY.PEEK[])")[1][0][1] for u in uids}
    d.logout()

    c = imaplib.IMAP4("127.0.0.1", iport)
    caps = [x.upper() for x in c.capabilities]
    t.check(not any(x.startswith("COMPRESS=") or x == "STARTTLS" for x in caps) and "IMAP4REV1" in caps,
            "CAPABILITY through the proxy has no COMPRESS or STARTTLS", caps)
    typ, _ = c.login(dc.user, dc.password)
    t.check(typ == "OK", "LOGIN through the proxy reaches dovecot")
    c.select("INBOX")
    # Every body but the third, which is read through the mount first (below).
    first = {u: c.uid("FETCH", u, "(BODY.PEEK[])")[1][0][1] for u in uids if u != uids[2]}
    t.check(first == {u: b for u, b in direct.items() if u != uids[2]},
            "imaplib UID FETCH BODY.PEEK[] through the proxy is byte-identical",
            [len(v) for v in first.values()])
    t.check(set(direct.values()) == set(sent), "the bodies are the ones delivered")
    c.logout()

    # The second time, from the cache (the fill goes through ghostfs's write queue).
    u_small, u_medium, u_mount, u_seen = uids[0], uids[1], uids[2], uids[3]
    raw = h.wait_for(lambda: (lambda r: r if b"from the cache" in r else None)(
        fetch_raw(iport, dc, b"UID FETCH " + u_medium + b" BODY.PEEK[]")), timeout=15)
    t.check(bool(raw) and body_of(raw) == direct[u_medium],
            "a body fetched once is answered from the cache, byte-identical", (raw or b"")[-200:])
    raw = fetch_raw(iport, dc, b"FETCH 1 (BODY.PEEK[])")
    t.check(b"from the cache" in raw and body_of(raw) == direct[u_small] and raw.startswith(b"* 1 FETCH ("),
            "FETCH by sequence number is answered from the cache", raw[:100] + raw[-100:])

    # Partials from the cache (RFC 3501 §6.4.5): the octets asked for, none past the end.
    raw = fetch_raw(iport, dc, b"UID FETCH " + u_medium + b" BODY.PEEK[]<100.5000>")
    t.check(b"from the cache" in raw and b"BODY[]<100> {5000}" in raw and body_of(raw) == direct[u_medium][100:5100],
            "a partial BODY.PEEK[]<100.5000> is answered from the cache", raw[:120] + raw[-120:])
    raw = fetch_raw(iport, dc, b"UID FETCH " + u_medium + b" BODY.PEEK[]<999999999.10>")
    t.check(b"from the cache" in raw and b"BODY[]<999999999> {0}" in raw,
            "a partial past the end is empty", raw[-200:])

    # A body read through the mount (never through the proxy) is a proxy hit (one cache, the
    # same keys).
    # (unseen mail is in new/, the rest in cur/, as Maildir readers expect)
    names = sorted(os.path.join(sub, n) for sub in ("new", "cur")
                   for n in os.listdir(os.path.join(mnt, "mail", sub)))
    via_mount = None
    for n in names:
        with open(os.path.join(mnt, "mail", n), "rb") as f:
            data = f.read()
        if data == direct[u_mount]:
            via_mount = n
    t.check(via_mount is not None, "the mount reads the message too", names)
    raw = h.wait_for(lambda: (lambda r: r if b"from the cache" in r else None)(
        fetch_raw(iport, dc, b"UID FETCH " + u_mount + b" BODY.PEEK[]")), timeout=15)
    t.check(bool(raw) and body_of(raw) == direct[u_mount],
            "a body read through the mount is a proxy hit", (raw or b"")[-200:])

    # \Seen kept: a non-PEEK fetch of a cached body marks it seen on the server.
    fetch_raw(iport, dc, b"UID FETCH " + u_seen + b" BODY.PEEK[]")
    raw = h.wait_for(lambda: (lambda r: r if b"from the cache" in r else None)(
        fetch_raw(iport, dc, b"UID FETCH " + u_seen + b" BODY[]")), timeout=15)
    t.check(bool(raw), "a non-PEEK fetch is answered from the cache", (raw or b"")[-200:])

    def seen_on_server():
        return b"\\Seen" in dc.uid_flags(u_seen)
    t.check(h.wait_for(seen_on_server, timeout=10), "and the message is \\Seen on the server")

    # A client that leaves as soon as it has its body (no LOGOUT: mbsync and curl end their
    # sessions right after the last FETCH) still leaves the body in the cache: the fill does not
    # depend on the session outliving the daemon's answer to the proxy's lookup.
    quick = [dc.seed("", message(f"quick{i}", 20 * 1024, 40 + i)) for i in range(12)]
    d = imaplib.IMAP4("127.0.0.1", dc.port)
    d.login(dc.user, dc.password)
    d.select("INBOX", readonly=True)
    validity = d.response("UIDVALIDITY")[1][0].decode()
    new_uids = [u for u in d.uid("SEARCH", None, "ALL")[1][0].split() if u not in uids]
    d.logout()
    for u in new_uids:
        s, f = raw_session(iport, dc.user, dc.password)
        s.sendall(b"s1 SELECT INBOX\r\n")
        h.imap_read_until(f, b"s1 ")
        s.sendall(b"f1 UID FETCH " + u + b" BODY.PEEK[]\r\n")
        h.imap_read_until(f, b"f1 ")
        s.close()
    ctlc = h.Control(ctl)

    def uncached():
        return [u for u in new_uids if not ctlc.call(
            "lookup", key=f"imap://{dc.user}@127.0.0.1:{dc.port}/INBOX;UIDVALIDITY={validity};UID={u.decode()}"
        ).get("result", {}).get("cached")]
    h.wait_for(lambda: not uncached(), timeout=10)
    left = uncached()
    ctlc.close()
    t.check(len(new_uids) == len(quick) and not left,
            "a body fetched by a client that closes at once is still stored in the cache",
            f"{len(new_uids)} fetched, not stored: {left}")

    # AUTHENTICATE PLAIN.
    c = imaplib.IMAP4("127.0.0.1", iport)
    typ, _ = c.authenticate("PLAIN", lambda _: f"\0{dc.user}\0{dc.password}".encode())
    c.select("INBOX", readonly=True)
    typ2, data = c.uid("FETCH", u_small, "(BODY.PEEK[])")
    t.check(typ == "OK" and data[0][1] == direct[u_small], "AUTHENTICATE PLAIN through the proxy", typ)
    c.logout()

    # curl imap://.
    url = f"imap://127.0.0.1:{iport}/INBOX;UID={u_medium.decode()}"
    out = subprocess.run(["curl", "-s", "--max-time", "20", "-u", f"{dc.user}:{dc.password}", url],
                         capture_output=True, timeout=30)
    t.check(out.returncode == 0 and out.stdout == direct[u_medium], "curl imap:// through the proxy",
            f"rc {out.returncode} {len(out.stdout)} bytes {out.stderr[-300:]}")

    # Malformed client input: BAD and a close, the proxy lives on.
    def bad_input(payload):
        s = socket.create_connection(("127.0.0.1", iport), timeout=10)
        f = s.makefile("rb")
        f.readline()
        try:
            s.sendall(payload)
        except OSError:
            pass
        got = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        s.close()
        return got
    got = bad_input(b"a1 APPEND INBOX {1073741824}\r\n")
    t.check(b"a1 BAD" in got and b"BYE" in got, "a 1 GB literal announced gets BAD and a close", got)
    got = bad_input(b"a2 NOOP " + b"x" * (200 * 1024) + b"\r\n")
    t.check(b"BAD" in got and b"BYE" in got, "an over-long line gets BAD and a close", got[:300])
    got = bad_input(b"a3 LOGIN {12x}\r\n")
    t.check(b"a3 BAD" in got, "a malformed literal size gets BAD and a close", got)
    raw = fetch_raw(iport, dc, b"UID FETCH " + u_small + b" BODY.PEEK[]")
    t.check(proxy.poll() is None and body_of(raw) == direct[u_small],
            "the proxy serves on after malformed input", open(plog).read()[-500:])

    # IDLE: no wake-ups of the proxy while an IDLE client waits.
    s, f = raw_session(iport, dc.user, dc.password)
    s.sendall(b"s1 SELECT INBOX\r\n")
    h.imap_read_until(f, b"s1 ")
    s.sendall(b"i1 IDLE\r\n")
    f.readline()  # "+ idling"
    time.sleep(0.5)
    before = ctx_switches(proxy.pid)
    time.sleep(3)
    after = ctx_switches(proxy.pid)
    s.sendall(b"DONE\r\n")
    done = h.imap_read_until(f, b"i1 ")
    s.close()
    t.check(after - before <= 2 and b"i1 OK" in done,
            "an IDLE client costs the proxy no wake-ups and outlives imap_timeout",
            f"{after - before} context switches; {done!r}")

    # imaps:// toward the server, verified against the test CA (SSL_CERT_FILE).
    env = dict(os.environ, SSL_CERT_FILE=dc.ca_file)
    p3, iport3, plog3 = start_proxy(mnt, ctl, f"imaps://127.0.0.1:{dc.imaps_port}/", env=env)
    ok = h.wait_port(iport3, 15)
    data = None
    try:
        c = imaplib.IMAP4("127.0.0.1", iport3)
        c.login(dc.user, dc.password)
        c.select("INBOX", readonly=True)
        data = c.uid("FETCH", u_medium, "(BODY.PEEK[])")[1][0][1]
        c.logout()
    except Exception as e:  # noqa: BLE001 - reported below
        data = repr(e).encode()
    t.check(ok and data == direct[u_medium], "an imaps:// origin: TLS toward the server, the same bytes",
            open(plog3).read()[-300:] + repr(data)[:200])

    # A server hanging mid-literal: the client gets a BYE after imap_timeout, the proxy lives.
    fake = hanging_server()
    conf = os.path.join(work, "proxy.toml")
    with open(conf, "w") as cf:
        cf.write("imap_timeout = 1\n")
    p2, iport2, plog2 = start_proxy(mnt, ctl, f"imap://127.0.0.1:{fake}/", config=conf)
    h.wait_port(iport2, 15)
    s = socket.create_connection(("127.0.0.1", iport2), timeout=15)
    greeting = s.recv(1000)
    s.sendall(b"a LOGIN u p\r\nb SELECT INBOX\r\nc FETCH 1 BODY[]\r\n")
    got = b""
    t0 = time.time()
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    s.close()
    t.check(b"COMPRESS" not in greeting and b"0123456789" in got and time.time() - t0 < 10 and p2.poll() is None,
            "a server hanging mid-literal: the client is closed after imap_timeout, the proxy lives",
            f"{greeting!r} {got[-200:]!r} {time.time() - t0:.1f}s")
    t.done()


if __name__ == "__main__":
    main()
