#!/usr/bin/env python3
"""ghostproxy stopped (SIGTERM) while its outbox worker waits on an SMTP server that accepted
the connection and never answers (proxy/smtp_proxy.cc kStopGrace): it stops within a few
seconds, not after curl's 60 s, and the message stays in the outbox: the next start sends it,
once, to a server that answers. (Before round 19 the stop waited for curl's low-speed limit.)
The silent server is this script's own socket; the answering one an aiosmtpd sink. TAP;
skipped without root, /dev/fuse or aiosmtpd."""
import os
import signal
import smtplib
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402
from ghostproxy_smtp_test import delivered, message, outbox, start_sink, start_with_deadline  # noqa: E402
from ghostproxy_smtp_stop_test import SINK  # noqa: E402

PLAN = 7
# kStopGrace (4 s) + curl's progress call, about once a second + the rest of the stop; with
# room for a loaded machine. Before the fix the stop took curl's LOW_SPEED_TIME, 60 s.
STOP_BOUND = 9
# The sink is ghostproxy_smtp_stop's SINK with a hold of 0 s: it answers at once.


def silent_server():
    """A server that accepts connections and never says a word; -> (port, accepted sockets)."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    held = []

    def run():
        while True:
            c, _ = ls.accept()
            held.append(c)  # kept open, unread, unanswered
    threading.Thread(target=run, daemon=True).start()
    return ls.getsockname()[1], held


def main():
    work, sink_dir, sink_port = start_sink(SINK, 0)
    t = h.Tap(PLAN)
    mnt, ctl = h.sleeping_card_mount(t, PLAN, work)
    box = os.path.join(work, "outbox")
    sport = h.free_port()
    log = os.path.join(work, "ghostproxy.log")
    silent_port, held = silent_server()

    def start(deadline, server_port):
        return start_with_deadline(work, deadline, mnt, ctl, sport, server_port, box, log)
    proxy = start(120, silent_port)
    if not t.check(h.wait_port(sport, 15), "ghostproxy listens for SMTP", open(log).read()):
        t.skip_rest(PLAN, "no SMTP listener")
        t.done()

    m = message("hang", 300)
    s = smtplib.SMTP("127.0.0.1", sport, timeout=20)
    refused = s.sendmail("a@example.org", ["b@example.org"], m)
    s.quit()
    t.check(refused == {} and len(outbox(box).get("waiting", [])) == 1, "one message waits in the outbox",
            f"{refused} {outbox(box)}")

    # Sent now, to the silent server: stopped while curl waits for its greeting.
    proxy.send_signal(signal.SIGUSR1)
    connected = h.wait_for(lambda: len(held) > 0, timeout=10)
    time.sleep(1)
    t0 = time.time()
    proxy.send_signal(signal.SIGTERM)
    try:
        rc = proxy.wait(STOP_BOUND)
    except subprocess.TimeoutExpired:
        rc = None
    took = time.time() - t0
    if rc is None:
        proxy.kill()  # the old stop: curl's 60 s
        proxy.wait(30)
    why = "no answer from the server before the proxy stopped" in open(log).read()
    t.check(connected and rc == 0 and why,
            f"SIGTERM while the server says nothing: the proxy stops (rc 0) within {STOP_BOUND} s",
            f"connected {connected}; rc {rc} after {took:.1f} s; the log says why {why}; " +
            open(log).read()[-400:])
    print(f"# stopped in {took:.1f} s", flush=True)
    ob = outbox(box)
    t.check(len(ob.get("waiting", [])) == 1 and not ob.get("refused"),
            "the message is still waiting in the outbox (not lost, not refused)", ob)

    # Started again on the same outbox, with a server that answers: sent once.
    proxy = start(2, sink_port)
    t.check(h.wait_port(sport, 15), "ghostproxy starts again on the same outbox", open(log).read()[-300:])
    h.wait_for(lambda: outbox(box).get("waiting") == [], timeout=15)
    time.sleep(2)
    copies = delivered(sink_dir)
    t.check(len(copies) == 1, "the recipient has exactly one copy", f"{copies}; " + open(log).read()[-400:])
    t.check(outbox(box).get("waiting") == [], "and the outbox is empty", outbox(box))
    proxy.terminate()
    proxy.wait(20)
    t.done()


if __name__ == "__main__":
    main()
