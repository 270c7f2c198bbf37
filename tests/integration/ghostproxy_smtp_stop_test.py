#!/usr/bin/env python3
"""ghostproxy stopped (SIGTERM) while its outbox worker waits for the server's answer to a
message's DATA (proxy/smtp_proxy.cc): the server's 250 comes while the loop has stopped, and the
message must still leave the outbox, so the next start does not send it a second time (before
round 18 the worker's posted result was dropped: the recipient got the mail twice). An aiosmtpd
sink that holds each DATA 3 s before its 250. TAP; skipped without root, /dev/fuse or aiosmtpd."""
import os
import signal
import smtplib
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402
from ghostproxy_smtp_test import delivered, message, outbox, start_sink, start_with_deadline  # noqa: E402

PLAN = 7
HOLD = 3  # seconds the sink holds a DATA before its 250

SINK = r'''
import asyncio, os, sys, time
from aiosmtpd.controller import Controller
out, port, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
class Handler:
    async def handle_DATA(self, server, session, envelope):
        n = len([f for f in os.listdir(out) if f.endswith(".eml")])
        with open(os.path.join(out, f"{n:04d}.eml"), "wb") as f:
            f.write(envelope.original_content)
        await asyncio.sleep(hold)  # received; the answer is late
        return "250 Message accepted"
c = Controller(Handler(), hostname="127.0.0.1", port=port)
c.start()
print("ready", flush=True)
while True:
    time.sleep(3600)
'''


def main():
    work, sink_dir, sink_port = start_sink(SINK, HOLD)
    t = h.Tap(PLAN)
    mnt, ctl = h.sleeping_card_mount(t, PLAN, work)
    box = os.path.join(work, "outbox")
    sport = h.free_port()
    log = os.path.join(work, "ghostproxy.log")

    def start(deadline):
        return start_with_deadline(work, deadline, mnt, ctl, sport, sink_port, box, log)
    proxy = start(120)
    if not t.check(h.wait_port(sport, 15), "ghostproxy listens for SMTP", open(log).read()):
        t.skip_rest(PLAN, "no SMTP listener")
        t.done()

    m = message("once", 200)
    s = smtplib.SMTP("127.0.0.1", sport, timeout=20)
    refused = s.sendmail("a@example.org", ["b@example.org"], m)
    s.quit()
    t.check(refused == {} and delivered(sink_dir) == [] and len(outbox(box).get("waiting", [])) == 1,
            "one message waits in the outbox", f"{refused} {delivered(sink_dir)} {outbox(box)}")

    # Sent now; stopped while the sink holds the DATA, before its 250.
    proxy.send_signal(signal.SIGUSR1)
    got = h.wait_for(lambda: delivered(sink_dir), timeout=10)
    t0 = time.time()
    proxy.send_signal(signal.SIGTERM)
    try:
        rc = proxy.wait(HOLD + 20)
    except subprocess.TimeoutExpired:
        rc = None
    early = bool(got) and t0 < os.path.getmtime(os.path.join(sink_dir, got[0])) + HOLD
    t.check(early and rc == 0, "the server has the DATA; SIGTERM before its answer, the proxy stops (rc 0)",
            f"sink {got}; before the answer {early}; rc {rc}; " + open(log).read()[-300:])
    ob = outbox(box)
    t.check(ob.get("waiting") == [] and not ob.get("refused"),
            "the server's late 250 took the message out of the outbox", ob)

    # Started again on the same outbox: past its deadline, nothing is sent a second time.
    proxy = start(2)
    t.check(h.wait_port(sport, 15), "ghostproxy starts again on the same outbox", open(log).read()[-300:])
    time.sleep(2 + HOLD + 4)
    copies = delivered(sink_dir)
    t.check(len(copies) == 1, "the recipient has exactly one copy", f"{copies}; " + open(log).read()[-400:])
    t.check(h.wait_for(lambda: outbox(box).get("waiting") == [], timeout=HOLD + 5), "and the outbox is empty",
            outbox(box))
    proxy.terminate()
    proxy.wait(HOLD + 20)
    t.done()


if __name__ == "__main__":
    main()
