#!/usr/bin/env python3
"""Random operations through ghostproxy's deferring IMAP proxy (imap_journal, ghostfs's emulated
card sleeping in PSM and woken by transfers), checked against a model of what the client was
told. A seeded sequence of UID STORE, STORE \\Deleted + EXPUNGE, UID MOVE, APPEND (into the
selected INBOX, whose message the client is shown only once the server reports it after a flush,
under the server's UID; and into Archive), FETCH of bodies by
sequence number and by UID, SEARCH, FETCH 1:* (UID FLAGS), NOOP, `ghostctl flush` and new
sessions: whether a change is deferred or sent at once (the card's mode decides, and body
fetches from the server wake it) must not change what the client sees. After every command
the client's view (sequence numbers, UIDs, flags, bodies, untagged EXPUNGEs, and the count its
EXISTS and EXPUNGEs leave it, applied in the order they came) must be the model's; after a
final flush dovecot itself must hold exactly the model's messages and flags, and the moved
bodies in the other mailbox. --seed (or GHOST_SEED) picks the sequence
(printed first); --ops its length. TAP; skipped without root, /dev/fuse, dovecot or nginx."""
import os
import random
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 4
FLAGS = ["\\Flagged", "\\Answered", "$Label1"]
COUNT = 40


def message(i):
    return (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: random {i}\r\n"
            f"Message-ID: <random.{i}@ghost>\r\n\r\n" + f"body {i} " * (40 + 53 * i) + "\r\n").encode()


def main():
    opts = h.seeded_options(ops=160)  # first, so that a run that dies before its checks can be replayed
    seed, ops = opts.seed, opts.ops
    rng = random.Random(seed)
    originals = [message(i) for i in range(COUNT)]
    t, dc, imap = h.held_mail(PLAN, originals)
    ctl = imap.ctl
    ghostctl = os.path.join(h.build_dir(), "fs", "ghostctl")

    d = dc.login()
    d.create("Archive")
    d.select("INBOX", readonly=True)
    view = [int(x) for x in d.uid("SEARCH", None, "ALL")[1][0].split()]
    body_of = {u: d.uid("FETCH", str(u), "(BODY.PEEK[])")[1][0][1] for u in view}
    d.logout()
    flags = {u: set() for u in view}
    archived = []
    # Messages APPENDed into INBOX that the client has not been shown yet (their EXISTS comes
    # from the server once the queue is sent), by Message-ID.
    appended = {}

    proxy = imap.start_checked(t, PLAN)
    time.sleep(1)  # subscribed to ghostfs's modes

    log, wrong, diag = [], [], []
    told = {"deferred": 0, "at once": 0}
    appends = {"INBOX": 0, "INBOX deferred": 0, "shown later": 0, "Archive": 0}

    def command(c, *args):
        """A command's tagged (type, text), counting the changes the proxy said it deferred."""
        typ, data = c._simple_command(*args)
        text = (data[0] or b"") if data else b""
        if typ == "OK" and args[0] in ("UID", "EXPUNGE"):
            told["deferred" if b"deferred" in text else "at once"] += 1
            if log and b"deferred" in text:
                log[-1] += " [deferred]"
        return typ, text

    current = {}  # the session's imaplib connection ("c"), for the wire lines of a failure

    def server_uids():
        try:
            d = dc.login()
            d.select("INBOX", readonly=True)
            uids = [int(x) for x in d.uid("SEARCH", None, "ALL")[1][0].split()]
            d.logout()
            return uids
        except Exception as e:  # noqa: BLE001 (a diagnostic only)
            return f"(dovecot not asked: {e})"

    def expect(ok, what):
        if not ok and len(wrong) < 5:
            wrong.append(f"op {len(log)} ({log[-1] if log else '-'}): {what}")
            if not diag:
                # What the next failure needs: the lines the client exchanged with the proxy
                # around it (imaplib's ring of the last lines; literals not included), the ops
                # before it, the model's view and dovecot's own UIDs now.
                diag.append("# the first failure: ops before: " + " | ".join(log[-8:-1]))
                diag.append(f"  model {view}; appended, not shown {sorted(appended)}")
                diag.append(f"  dovecot's INBOX now {server_uids()}")
                diag.extend("  wire " + line for line in wire(current.get("c")))

    def wire(c, n=24):
        """The last `n` lines imaplib logged for `c` (sent ">", received "<"), oldest first."""
        ring = getattr(c, "_cmd_log", None) or {}
        return [text[:160] for text, _ in sorted(ring.values(), key=lambda e: e[1])][-n:]

    def counted(c):
        """The client's message count after the EXISTS and EXPUNGE since the last call, applied
        in order, must be the model's; an EXISTS never lowers it, an EXPUNGE names one of its
        messages. (The count is then the model's again, so that one error is reported once.)"""
        events, before = list(c.events), c.known
        c.events.clear()
        for kind, n in events:
            if kind == "EXISTS":
                expect(n >= c.known, f"EXISTS {n} below the {c.known} messages the client knew ({events})")
                c.known = n
            else:
                expect(1 <= n <= c.known, f"EXPUNGE {n} of the client's {c.known} messages ({events})")
                c.known -= 1
        expect(c.known == len(view), f"the client was left with {c.known} messages ({before}, then {events}), "
               f"the model has {len(view)}")
        c.known = len(view)

    def session():
        c = h.OrderedIMAP4("127.0.0.1", imap.port)
        c._cmd_log_len = 80  # imaplib's ring of the last lines exchanged, for wire()
        current["c"] = c
        c.login(dc.user, dc.password)
        typ, data = c.select("INBOX")
        absorb(c)  # a SELECT sends queued APPENDs into INBOX first: the new session sees them
        expect(typ == "OK" and int(data[0]) == len(view), f"SELECT says {data} EXISTS, the model {len(view)}")
        c.uid("FETCH", "1:*", "(FLAGS)")  # the proxy learns the flags (a deletion needs them)
        counted(c)
        c.untagged_responses.clear()
        return c

    def absorb(c):
        """An EXISTS above the model's count may only announce appended messages (after a
        flush): they join the model's view, checked by their Message-IDs and bodies. Returns the
        untagged EXISTS values the last command brought (left in place)."""
        exists = [int(x) for x in c.untagged_responses.get("EXISTS", [])]
        n = max(exists, default=0)
        if n <= len(view):
            return exists
        saved = dict(c.untagged_responses)
        c.untagged_responses.clear()
        # Up to the mailbox's end as it is now ("*"), not to n: imaplib keeps no order between
        # an EXISTS and the EXPUNGEs of the same response, and an EXPUNGE after the EXISTS (a
        # MOVE's, with a flushed APPEND announced just before) leaves fewer than n messages (a
        # fetch to n was refused: "Invalid messageset", CI at seed 53559). "x:*" past the end
        # is the last message: only sequence numbers past the model's count are new.
        mark = len(c.events)
        typ, data = c.fetch(f"{len(view) + 1}:*", "(UID BODY.PEEK[])")
        # The fetch itself may bring an EXISTS for more (a FETCH while messages are hidden sends
        # the queue first, its APPENDs into INBOX with it: seed 971431, EXISTS 25 then 26 and
        # the fetch's messages 25 and 26). counted() replays it with the others.
        n = max([n] + [v for kind, v in c.events[mark:] if kind == "EXISTS"])
        got = [x for x in data if isinstance(x, tuple)]
        new = []
        for head, body in got:
            m = re.match(rb"(\d+) \(.*UID (\d+)", head)
            mid = re.search(rb"Message-ID: (<[^>]+>)", body)
            if m and int(m.group(1)) <= len(view):
                continue
            new.append((int(m.group(1)) if m else 0, int(m.group(2)) if m else 0, mid.group(1) if mid else b"", body))
        expect(typ == "OK" and len(new) <= n - len(view) and
               all(mid in appended and appended[mid] == body for _, _, mid, body in new),
               f"EXISTS {n} over the model's {len(view)}: {[(s, u, mid) for s, u, mid, _ in new]}, "
               f"appended and not shown {sorted(appended)}")
        for _, uid, mid, body in new:
            if mid in appended:
                appends["shown later"] += 1
                view.append(uid)
                body_of[uid] = body
                flags[uid] = set()
                appended.pop(mid)
        c.untagged_responses.clear()
        c.untagged_responses.update(saved)
        return exists

    def unsolicited(c, allowed_expunges=()):
        """The untagged EXPUNGE and EXISTS the last command brought: only those expected."""
        absorb(c)
        ex = [int(x) for x in c.untagged_responses.pop("EXPUNGE", [])]
        expect(ex == list(allowed_expunges), f"untagged EXPUNGE {ex}, expected {list(allowed_expunges)}")
        # The EXISTS values alone say nothing: an EXISTS before an EXPUNGE of the same response
        # counts the expunged message (the MOVE at op 70 of seed 385800: "* 29 EXISTS" announcing
        # a flushed APPEND, then "* 8 EXPUNGE", the client left with 28). In order, they must
        # leave the client with the model's count.
        counted(c)
        c.untagged_responses.clear()

    def fetch_body(c, by_uid):
        seq = rng.randrange(len(view)) + 1
        uid = view[seq - 1]
        log.append(f"{'UID ' if by_uid else ''}FETCH {uid if by_uid else seq} BODY.PEEK[] (uid {uid})")
        typ, data = c.uid("FETCH", str(uid), "(BODY.PEEK[])") if by_uid else c.fetch(str(seq), "(BODY.PEEK[])")
        got = [x for x in data if isinstance(x, tuple)]
        expect(typ == "OK" and len(got) == 1 and got[0][1] == body_of[uid] and got[0][0].startswith(b"%d (" % seq),
               f"{typ} {[x[0][:40] for x in got]} (expected seq {seq}, {len(body_of[uid])} bytes)")
        unsolicited(c)

    def wake():
        # Ghost hints count as transfers (DESIGN §3.3): bursts of them switch the card to CAM (as in
        # ghostproxy_imap_deferred_test.py), where it stays while transfers go on, so the changes
        # after it go to the server at once. Once forced halfway, and at random.
        log.append("the card woken by ghost hints")
        ctlc = h.Control(ctl)
        for _ in range(12):
            ctlc.ghost_hints()
            card = [d for d in ctlc.call("devices").get("result", []) if d.get("name") == "cisco-350"]
            if card and card[0].get("mode") == "CAM":
                break
            time.sleep(1.0)
        ctlc.close()

    def card_mode():
        ctlc = h.Control(ctl)
        try:
            card = [d for d in ctlc.call("devices").get("result", []) if d.get("name") == "cisco-350"]
            return card[0].get("mode") if card else None
        finally:
            ctlc.close()

    c = session()
    # One change with the card in PSM before the random part, so that every run defers at least
    # one change whatever its seed does later: a seed whose fetches and APPENDs keep the card in
    # CAM would otherwise defer none, and the check below would say nothing about the journal.
    psm = h.wait_for(lambda: card_mode() == "PSM", 30)
    uid = view[0]
    log.append(f"UID STORE {uid} +FLAGS.SILENT (\\Flagged) with the card in PSM ({card_mode()})")
    typ, text = command(c, "UID", "STORE", str(uid), "+FLAGS.SILENT", "(\\Flagged)")
    expect(typ == "OK" and (b"deferred" in text or not psm),
           f"the first change, with the card in PSM, was not deferred: {typ} {text}")
    c.untagged_responses.pop("FETCH", None)
    flags[uid].add("\\Flagged")
    unsolicited(c)
    for step in range(ops):
        if not view:
            break
        r = rng.random()
        if step == ops // 2:
            wake()
        elif r < 0.25:
            uid, flag, add = rng.choice(view), rng.choice(FLAGS), rng.random() < 0.6
            log.append(f"UID STORE {uid} {'+' if add else '-'}FLAGS.SILENT ({flag})")
            typ, text = command(c, "UID", "STORE", str(uid), ("+" if add else "-") + "FLAGS.SILENT", f"({flag})")
            expect(typ == "OK", f"{typ} {text}")
            c.untagged_responses.pop("FETCH", None)
            (flags[uid].add if add else flags[uid].discard)(flag)
            unsolicited(c)
        elif r < 0.35:
            uid = rng.choice(view)
            seq = view.index(uid) + 1
            log.append(f"STORE \\Deleted + EXPUNGE of {uid} (seq {seq})")
            typ, text = command(c, "UID", "STORE", str(uid), "+FLAGS.SILENT", "(\\Deleted)")
            expect(typ == "OK", f"STORE {typ} {text}")
            c.untagged_responses.pop("FETCH", None)
            unsolicited(c)
            typ, text = command(c, "EXPUNGE")
            ex = [int(x) for x in c.untagged_responses.pop("EXPUNGE", [])]
            expect(typ == "OK" and ex == [seq], f"EXPUNGE {typ} {text} {ex}")
            view.remove(uid)
            flags.pop(uid)
            unsolicited(c)
        elif r < 0.42:
            uid = rng.choice(view)
            seq = view.index(uid) + 1
            log.append(f"UID MOVE {uid} Archive (seq {seq})")
            typ, text = command(c, "UID", "MOVE", str(uid), "Archive")
            expect(typ == "OK", f"MOVE {typ} {text}")
            ex = [int(x) for x in c.untagged_responses.pop("EXPUNGE", [])]
            expect(ex == [seq], f"MOVE's untagged EXPUNGE {ex}, expected [{seq}]")
            view.remove(uid)
            flags.pop(uid)
            archived.append(body_of[uid])
            unsolicited(c)
        elif r < 0.57:
            fetch_body(c, by_uid=False)
        elif r < 0.67:
            fetch_body(c, by_uid=True)
        elif r < 0.75:
            log.append("SEARCH ALL, UID SEARCH ALL")
            before = len(view)
            typ, data = c.search(None, "ALL")
            absorb(c)  # the SEARCH may have sent queued APPENDs first: their EXISTS came with it
            typ2, data2 = c.uid("SEARCH", None, "ALL")
            # The messages those APPENDs added are announced by the EXISTS that ends the command;
            # the server may have computed the SEARCH before it saw them (dovecot does), so its
            # result may stop at the count before them. The UID SEARCH after it must see them all.
            got = [int(x) for x in data[0].split()] if typ == "OK" else None
            expect(got in (list(range(1, len(view) + 1)), list(range(1, before + 1))),
                   f"SEARCH ALL {data}, the model has {len(view)} ({before} before the command)")
            expect(typ2 == "OK" and [int(x) for x in data2[0].split()] == view, f"UID SEARCH ALL {data2}, the model {view}")
            unsolicited(c)
        elif r < 0.83:
            log.append("FETCH 1:* (UID FLAGS)")
            before = len(view)
            typ, data = c.fetch("1:*", "(UID FLAGS)")
            absorb(c)  # (an EXISTS may come with it: the queue sent at a deadline meanwhile)
            seen = []
            for item in data:
                text = (item if isinstance(item, bytes) else item[0]).decode()
                m = re.match(r"(\d+) \(.*UID (\d+)", text)
                if not m:
                    continue
                f = set(re.search(r"FLAGS \(([^)]*)\)", text).group(1).split()) if "FLAGS (" in text else set()
                seen.append((int(m.group(1)), int(m.group(2)), f & set(FLAGS)))
            expect(typ == "OK" and [(s, u) for s, u, _ in seen] == list(enumerate(view, 1))[:max(before, len(seen))],
                   f"FETCH 1:* {[(s, u) for s, u, _ in seen]}, the model {view}")
            bad = [(u, f, flags.get(u)) for _, u, f in seen if f != flags.get(u)]
            expect(not bad, f"flags (uid, seen, model): {bad[:4]}")
            unsolicited(c)
        elif r < 0.87:
            into = "INBOX" if rng.random() < 0.6 else "Archive"
            n_app = len(log)
            body = (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: appended {n_app}\r\n"
                    f"Message-ID: <appended.{seed}.{n_app}@ghost>\r\n\r\n" + f"appended {n_app} " * (30 + n_app) +
                    "\r\n").encode()
            log.append(f"APPEND into {into} (<appended.{seed}.{n_app}@ghost>)")
            typ, data = c.append(into, None, None, body)
            text = b" ".join(x for x in data if isinstance(x, bytes))
            expect(typ == "OK", f"APPEND {typ} {data}")
            told["deferred" if b"deferred" in text else "at once"] += 1
            appends[into] += 1
            appends["INBOX deferred"] += into == "INBOX" and b"deferred" in text
            if into == "Archive":
                archived.append(body)
            else:
                appended[f"<appended.{seed}.{n_app}@ghost>".encode()] = body
            unsolicited(c)
        elif r < 0.89:
            wake()
        elif r < 0.92:
            log.append("NOOP")
            typ, _ = c.noop()
            expect(typ == "OK", typ)
            unsolicited(c)
        elif r < 0.96:
            log.append("ghostctl flush")
            subprocess.run([ghostctl, "--control", ctl, "flush"], capture_output=True, timeout=30)
        else:
            log.append("LOGOUT, a new session")
            c.logout()
            c = session()
    c.logout()
    if os.environ.get("GHOST_RANDOM_LOG"):
        with open(os.environ["GHOST_RANDOM_LOG"], "w") as lf:
            lf.write("\n".join(log) + "\n")
    # (Tap.check shows the first 40 lines of the detail on stderr: the failures, the proxy's
    # last words, then what the first failure needs.)
    # Vacuous unless some changes waited in the journal (the card in PSM); those sent at once (after
    # the card was woken) are counted too.
    t.check(not wrong and told["deferred"] > 0,
            f"{len(log)} random operations, changes deferred {told['deferred']}, sent at once {told['at once']}: "
            f"the client's view was always the model's (seed {seed}; APPENDs {appends})", "\n".join(wrong) + "\n" + imap.tail(400) + "\n" + "\n".join(diag))

    subprocess.run([ghostctl, "--control", ctl, "flush"], capture_output=True, timeout=30)

    def server():
        d = dc.login()
        d.select("INBOX", readonly=True)
        out = {}
        for item in d.uid("FETCH", "1:*", "(FLAGS)")[1]:
            if not item:
                continue
            text = item.decode()
            uid = int(text.split("UID ")[1].split()[0].rstrip(")"))
            out[uid] = set(text.split("FLAGS (")[1].split(")")[0].split()) & set(FLAGS)
        d.logout()
        return out
    model = {u: flags[u] for u in view}

    def matches():
        # The model's messages and flags, plus each APPEND never shown to the client, once.
        srv = server()
        extra = {u: f for u, f in srv.items() if u not in model}
        return ({u: srv.get(u) for u in model} == model and len(extra) == len(appended)
                and all(not f for f in extra.values()) and
                dc.bodies("INBOX") == sorted([body_of[u] for u in view] + list(appended.values())))
    landed = h.wait_for(lambda: matches() or None, timeout=20)
    t.check(bool(landed), f"after the flush dovecot has exactly the model's messages and flags (seed {seed})",
            f"server {server()} model {model} appended, never shown {sorted(appended)}\n" + "\n".join(log[-12:])
            + "\n" + imap.tail())
    t.check(sorted(dc.bodies("Archive")) == sorted(archived) and proxy.poll() is None,
            f"the moved messages are in Archive, byte-identical, and the proxy lives on (seed {seed})",
            f"{len(dc.bodies('Archive'))} in Archive, {len(archived)} moved\n" + imap.tail())
    t.done()


if __name__ == "__main__":
    main()
