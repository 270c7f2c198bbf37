#!/usr/bin/env python3
"""ghostproxy's SMTP outbox (proxy/smtp_proxy.h) in front of a real SMTP server on
127.0.0.1 (python3-aiosmtpd as the sink, with AUTH): Python smtplib and curl smtp:// submit
through the proxy and get 250 at once while nothing reaches the server; `ghostctl outbox` lists
what waits; the outbox goes at its deadline (smtp_deadline) and on SIGUSR1, byte-identical and
with the client's AUTH; a message the server refuses (550) is kept in refused/ with the reply;
mail journaled before a SIGKILL is sent after the restart; `ghostctl flush` sends the outbox, and
the deadline is scaled by ghostfs's knob (zero at K=100); malformed input gets 5xx (a close for
an over-long line) and the proxy lives on. TAP; skipped without root, /dev/fuse or aiosmtpd."""
import base64
import json
import os
import signal
import smtplib
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 17
SYSTEM_PYTHON = "/usr/bin/python3"

SINK = r'''
import os, sys, time
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
out, port, user, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
class Handler:
    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("refuse@"):
            return "550 5.1.1 no such user here (ghost test)"
        envelope.rcpt_tos.append(address)
        return "250 OK"
    async def handle_DATA(self, server, session, envelope):
        # The .auth first, each file renamed into place whole: the test reads both as soon as
        # the .eml is there (written the other way round, check 6 once read an empty .auth).
        n = len([f for f in os.listdir(out) if f.endswith(".eml")])
        for name, data in ((f"{n:04d}.auth", (session.authenticated and str(session.auth_data.login, "utf-8") or "").encode()),
                           (f"{n:04d}.eml", envelope.original_content)):
            with open(os.path.join(out, ".tmp"), "wb") as f:
                f.write(data)
            os.rename(os.path.join(out, ".tmp"), os.path.join(out, name))
        return "250 Message accepted"
def auth(server, session, envelope, mechanism, auth_data):
    ok = isinstance(auth_data, LoginPassword) and auth_data.login == user.encode() and auth_data.password == password.encode()
    return AuthResult(success=ok, auth_data=auth_data)
c = Controller(Handler(), hostname="127.0.0.1", port=port, authenticator=auth, auth_require_tls=False,
               auth_required=False)
c.start()
print("ready", flush=True)
while True:
    time.sleep(3600)
'''


def delivered(out):
    return sorted(n for n in os.listdir(out) if n.endswith(".eml"))


def message(subject, n):
    body = "".join(f"line {i} of {subject}\r\n" for i in range(n))
    return (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {subject}\r\n\r\n"
            f".a line that starts with a dot\r\n{body}").encode()


def outbox(dirpath):
    exe = os.path.join(h.build_dir(), "fs", "ghostctl")
    r = subprocess.run([exe, "--json", "outbox", dirpath], capture_output=True, text=True, timeout=10)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr}


def start_sink(script_text, *args):
    """Runs the aiosmtpd sink `script_text` (argv: its directory, its port, then `args`) under
    Debian's python3; -> (work directory, its directory, its port). Skips the whole test
    without root, /dev/fuse or aiosmtpd, or when the sink does not start."""
    h.require_root_and_fuse()
    if subprocess.run([SYSTEM_PYTHON, "-c", "import aiosmtpd"], capture_output=True).returncode != 0:
        h.skip_all("python3-aiosmtpd is not installed")
    work = h.tempdir()
    sink_dir = os.path.join(work, "sink")
    os.makedirs(sink_dir)
    sink_port = h.free_port()
    script = os.path.join(work, "sink.py")
    with open(script, "w") as f:
        f.write(script_text)
    sink = subprocess.Popen([SYSTEM_PYTHON, script, sink_dir, str(sink_port), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    h.on_exit(lambda: sink.poll() is None and sink.kill())
    if not h.wait_port(sink_port, 15):
        h.skip_all("the aiosmtpd sink did not start: " + (sink.stdout.read() if sink.poll() is not None else ""))
    return work, sink_dir, sink_port


def start_smtp_proxy(mnt, ctl, conf, smtp_port, sink_port, box, log):
    """ghostproxy on the mount with config `conf`, taking mail on `smtp_port` into the outbox
    `box` and sending it to the sink; its output appended to `log`; stopped at exit."""
    exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
    p = subprocess.Popen([exe, "--listen", f"127.0.0.1:{h.free_port()}", "--mount", mnt, "--control", ctl,
                          "--config", conf, "--smtp-listen", f"127.0.0.1:{smtp_port}",
                          "--smtp-origin", f"smtp://127.0.0.1:{sink_port}/", "--smtp-outbox", box],
                         stdout=open(log, "a"), stderr=subprocess.STDOUT)
    h.on_exit(lambda: p.poll() is None and (p.terminate(), p.wait(10)))
    return p



def start_with_deadline(work, deadline, mnt, ctl, smtp_port, server_port, box, log):
    """start_smtp_proxy with a config of its own that sets only smtp_deadline = `deadline`."""
    conf = os.path.join(work, f"proxy-{deadline}.toml")
    with open(conf, "w") as f:
        f.write(f"smtp_deadline = {deadline}\n")
    return start_smtp_proxy(mnt, ctl, conf, smtp_port, server_port, box, log)


def main():
    work, sink_dir, sink_port = start_sink(SINK, "ghost", "s3cret pass")
    t = h.Tap(PLAN)
    mnt, ctl = h.sleeping_card_mount(t, PLAN, work)
    box = os.path.join(work, "outbox")
    conf = os.path.join(work, "proxy.toml")
    with open(conf, "w") as f:
        f.write("smtp_deadline = 4\n")
    sport = h.free_port()
    log = os.path.join(work, "ghostproxy.log")

    def start(conf=conf):
        return start_smtp_proxy(mnt, ctl, conf, sport, sink_port, box, log)
    proxy = start()
    if not t.check(h.wait_port(sport, 15), "ghostproxy listens for SMTP with --smtp-listen", open(log).read()):
        t.skip_rest(PLAN, "no SMTP listener")
        t.done()

    # smtplib with AUTH: 250 at once, nothing at the server yet, listed by ghostctl outbox.
    m1 = message("first", 2000)
    s = smtplib.SMTP("127.0.0.1", sport, timeout=20)
    s.login("ghost", "s3cret pass")
    t0 = time.time()
    refused = s.sendmail("a@example.org", ["b@example.org"], m1)
    took = time.time() - t0
    s.quit()
    t.check(refused == {} and took < 2, "smtplib gets 250 at once", f"{refused} {took:.2f}s")
    t.check(delivered(sink_dir) == [], "nothing reaches the server before the deadline")
    ob = outbox(box)
    t.check(len(ob.get("waiting", [])) == 1 and ob["waiting"][0]["rcpts"] == ["b@example.org"],
            "ghostctl outbox lists the waiting message", ob)
    got = h.wait_for(lambda: delivered(sink_dir), timeout=15)
    ok = bool(got)
    if ok:
        with open(os.path.join(sink_dir, got[0]), "rb") as f:
            data = f.read()
        with open(os.path.join(sink_dir, got[0][:-4] + ".auth")) as f:
            who = f.read()
    t.check(ok and data == m1, "at the deadline it is sent byte-identical", got)
    t.check(ok and who == "ghost", "with the client's AUTH passed through", who if ok else "")
    t.check(h.wait_for(lambda: outbox(box).get("waiting") == [], timeout=5), "and leaves the outbox", outbox(box))

    # curl smtp:// without AUTH, sent by SIGUSR1 before the deadline.
    mail = os.path.join(work, "curl.eml")
    m2 = message("curl", 300)
    with open(mail, "wb") as f:
        f.write(m2)
    r = subprocess.run(["curl", "-s", "--max-time", "20", f"smtp://127.0.0.1:{sport}/ghost",
                        "--mail-from", "c@example.org", "--mail-rcpt", "d@example.org", "-T", mail],
                       capture_output=True, timeout=30)
    proxy.send_signal(signal.SIGUSR1)
    got = h.wait_for(lambda: len(delivered(sink_dir)) >= 2 and delivered(sink_dir), timeout=3)
    ok = bool(got)
    if ok:
        with open(os.path.join(sink_dir, got[1]), "rb") as f:
            data = f.read()
    t.check(r.returncode == 0 and ok and data == m2, "curl smtp:// through the outbox, sent on SIGUSR1",
            f"rc {r.returncode} {r.stderr[-200:]} {got}")

    # A refusal is kept with the server's reply.
    s = smtplib.SMTP("127.0.0.1", sport, timeout=20)
    s.sendmail("a@example.org", ["refuse@example.org"], message("refused", 10))
    s.quit()
    proxy.send_signal(signal.SIGUSR1)
    ob = h.wait_for(lambda: (lambda o: o if o.get("refused") else None)(outbox(box)), timeout=10) or {}
    t.check(bool(ob.get("refused")) and "550" in ob["refused"][0].get("reply", "") and ob.get("waiting") == [],
            "a message the server refuses is kept in refused/ with its reply", ob)

    # SIGKILL with mail journaled: nothing lost. Judged by content, not by count: under load the
    # 4 s deadline can send m3 before the kill, and a kill between the server's 250 and the
    # journal's removal sends that message again after the restart (SMTP is at least once), so
    # "two new files after the restart" failed 3 of 10 loaded runs (round 18) with nothing lost.
    m3, m4 = message("crash1", 100), message("crash2", 5000)
    before = len(delivered(sink_dir))
    s = smtplib.SMTP("127.0.0.1", sport, timeout=20)
    s.sendmail("a@example.org", ["b@example.org"], m3)
    s.sendmail("a@example.org", ["b@example.org", "e@example.org"], m4)
    proxy.kill()
    proxy.wait()
    s.close()
    proxy = start()
    h.wait_port(sport, 15)

    def bodies_since():
        out = []
        for n in delivered(sink_dir)[before:]:
            with open(os.path.join(sink_dir, n), "rb") as f:
                out.append(f.read())
        return out
    h.wait_for(lambda: m3 in bodies_since() and m4 in bodies_since() and outbox(box).get("waiting") == [],
               timeout=20)
    bodies = bodies_since()
    t.check(m3 in bodies and m4 in bodies and set(bodies) <= {m3, m4},
            "mail journaled before a SIGKILL is sent after the restart",
            f"{len(bodies)} delivered: m3 x{bodies.count(m3)}, m4 x{bodies.count(m4)}, "
            f"{len(bodies) - bodies.count(m3) - bodies.count(m4)} others; outbox {outbox(box)}")

    # Malformed input.
    def talk(payload):
        c = socket.create_connection(("127.0.0.1", sport), timeout=10)
        c.recv(1000)
        c.sendall(payload)
        got = b""
        try:
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        c.close()
        return got
    got = talk(b"EHLO x\r\nMAIL FROM:<" + b"a" * 10000 + b">\r\n")
    t.check(b"500" in got, "an over-long command line gets 500 and a close", got[-200:])
    got = talk(b"AUTH PLAIN !!!notbase64\r\nMAIL FROM:a@b\r\nRCPT TO:<x@y>\r\nDATA\r\nQUIT\r\n")
    t.check(b"501 5.5.2 Malformed AUTH" in got and b"501 5.1.7" in got and b"503" in got and b"221" in got,
            "bad base64, a bad path and DATA without a transaction get 5xx", got)
    # Bytes that are not UTF-8 in an address or an AUTH user: refused at the door (the outbox's
    # envelope is JSON; before round 19 its dump threw at DATA's end and the proxy aborted).
    got = talk(b"EHLO x\r\nMAIL FROM:<\xff@b>\r\nRCPT TO:<x\xc3@y>\r\nDATA\r\nSubject: x\r\n\r\nb\r\n.\r\n"
               b"AUTH PLAIN " + base64.b64encode(b"\0us\xfeer\0pw") + b"\r\nQUIT\r\n")
    t.check(b"501 5.1.7" in got and b"503" in got and b"501 5.5.4" in got and b"250 2.0.0 Ok: queued" not in got
            and b"221" in got, "an address or AUTH user that is not UTF-8 gets 5xx, nothing is journaled", got)
    t.check(proxy.poll() is None, "the proxy lives on after malformed input")

    # The network card entering its high-power mode (a transfer through the mount) sends the
    # outbox long before its deadline.
    proxy.terminate()
    proxy.wait(10)
    conf_long = os.path.join(work, "proxy-long.toml")
    with open(conf_long, "w") as f:
        f.write("smtp_deadline = 120\n")
    proxy = start(conf_long)
    h.wait_port(sport, 15)
    time.sleep(1)  # the proxy has subscribed to the modes
    before = len(delivered(sink_dir))
    s = smtplib.SMTP("127.0.0.1", sport, timeout=20)
    s.sendmail("a@example.org", ["b@example.org"], message("radio", 50))
    s.quit()
    time.sleep(1)
    quiet = len(delivered(sink_dir)) == before
    # Ghost hints count as transfers (DESIGN §3.3): a first run of them teaches the STPM module,
    # a later run switches the card to CAM (as in ghostfs_imap_sync_test.py).
    ctlc = h.Control(ctl)
    sent = False
    modes = []
    for _ in range(10):
        # Pipelined, so the run's 20 hints come well within the break-even time even on a
        # loaded machine.
        ctlc.ghost_hints()
        sent = h.wait_for(lambda: len(delivered(sink_dir)) > before, timeout=1.5)
        modes.append([d["mode"] for d in ctlc.call("devices")["result"] if d["kind"] == "network"])
        if sent:
            break
        time.sleep(1.2)  # longer than the break-even time: the next hints start a new run
    proxy_stats = ctlc.call("stats")["result"]["proxy"]
    print(f"# daemon: open transfers {proxy_stats.get('open_transfers')}, ended with their connection "
          f"{proxy_stats.get('orphaned_transfers')}", flush=True)
    why = ""
    if not sent:  # what the card's module and the daemon's open transfers were
        why = "; " + "; ".join(d.get("policy", "") for d in ctlc.call("devices")["result"] if d["kind"] == "network")
        why += f"; open transfers {ctlc.call('stats')['result']['proxy'].get('open_transfers')}"
    ctlc.close()
    t.check(quiet and sent, "the outbox goes when the network card enters its high-power mode",
            f"quiet {quiet} sent {sent}; card {modes}{why}; " + open(log).read()[-300:])

    # `ghostctl flush` reaches the proxy's outbox (ghostfs publishes a flush event). The send
    # above may still be under way, so the count starts once the outbox is empty.
    ghostctl = os.path.join(h.build_dir(), "fs", "ghostctl")
    h.wait_for(lambda: outbox(box).get("waiting") == [], timeout=20)
    before = len(delivered(sink_dir))
    s = smtplib.SMTP("127.0.0.1", sport, timeout=20)
    s.sendmail("a@example.org", ["b@example.org"], message("flush", 50))
    s.quit()
    quiet = len(delivered(sink_dir)) == before
    subprocess.run([ghostctl, "--control", ctl, "flush"], capture_output=True, timeout=30)
    t.check(quiet and h.wait_for(lambda: len(delivered(sink_dir)) > before, timeout=10),
            "ghostctl flush sends the outbox", f"quiet {quiet}; " + open(log).read()[-300:])

    # The deadline is scaled by ghostfs's knob: smtp_deadline 120 s at K=50 is 0 at K=100.
    subprocess.run([ghostctl, "--control", ctl, "knob", "100"], capture_output=True, timeout=30)
    proxy.terminate()
    proxy.wait(10)
    proxy = start(conf_long)
    h.wait_port(sport, 15)
    time.sleep(1)  # the proxy has read the knob
    before = len(delivered(sink_dir))
    s = smtplib.SMTP("127.0.0.1", sport, timeout=20)
    s.sendmail("a@example.org", ["b@example.org"], message("knob", 50))
    s.quit()
    t.check(h.wait_for(lambda: len(delivered(sink_dir)) > before, timeout=10),
            "at knob 100 the outbox deadline is zero: mail goes at once", open(log).read()[-300:])
    subprocess.run([ghostctl, "--control", ctl, "knob", "50"], capture_output=True, timeout=30)
    t.done()


if __name__ == "__main__":
    main()
