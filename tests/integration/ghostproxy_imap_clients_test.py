#!/usr/bin/env python3
"""Real IMAP clients against a real dovecot on 127.0.0.1 THROUGH ghostproxy's IMAP proxy
(--imap-listen, proxy/imap_proxy.h), its cache in a ghostfs mount with the same account:
mbsync (isync) syncs INBOX to a local Maildir whose bodies are byte-identical to dovecot's (but
for CRLF stored as LF, as both sync clients write a Maildir, and mbsync's own X-TUID line), and a
flag change and a deletion made in that Maildir land on the server after the next sync;
offlineimap3 the same; through a second proxy that defers changes (imap_journal, ghostfs's card
in PSM), mbsync's flag change waits in the journal until `ghostctl flush` (its CLOSE does not send it),
and so does a local deletion (its \\Deleted and expunge), and offlineimap3's mark-read, flag
and deletion wait the same way until the flush, after which its next run agrees with dovecot
without downloading again; while a deferred \\Deleted is sent
before a CLOSE whose messages' flags the proxy does not all know; curl imap:// fetches a body; a body once read whole from the cache is
answered from the proxy's RAM without asking ghostfs; neomutt with imap:// (in tmux) lists and
displays a message. Each client missing is a skip with its name. TAP; skipped without root,
/dev/fuse or dovecot."""
import imaplib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 23
SUBJECTS = ["Alpha lunch", "Bravo report", "Charlie hints", "Delta notes", "Echo plans", "Foxtrot end"]


def message(i, subject):
    # Distinct sizes, one over 64 KiB (several reads through the proxy).
    size = [2000, 70 * 1024, 5000, 12000, 3000, 9000][i]
    head = (f"From: Sender {i} <s{i}@example.org>\r\nTo: me@example.org\r\nSubject: {subject}\r\n"
            f"Message-ID: <c{i}@ghost.test>\r\nDate: Mon, {i + 1} Jan 2024 10:00:00 +0000\r\n\r\n"
            f"This is the body of message number {i}.\r\n")
    out, n = head, 0
    while len(out) < size:
        out += f"{i} line {n:05d} " + "y" * 60 + "\r\n"
        n += 1
    return out.encode()


class Server:
    """imaplib straight to dovecot: what the server holds."""

    def __init__(self, dc):
        self.dc = dc

    def state(self):
        """{Message-ID: (flags bytes, body)} of INBOX, expunged messages gone."""
        d = imaplib.IMAP4("127.0.0.1", self.dc.port)
        d.login(self.dc.user, self.dc.password)
        d.select("INBOX", readonly=True)
        out = {}
        for u in d.uid("SEARCH", None, "ALL")[1][0].split():
            data = d.uid("FETCH", u, "(FLAGS BODY.PEEK[])")[1]
            body = data[0][1]
            mid = [ln for ln in body.split(b"\r\n") if ln.startswith(b"Message-ID:")][0].split()[1]
            out[mid] = (data[0][0], body)
        d.logout()
        return out


def maildir_messages(root):
    """{Message-ID: (path, bytes)} of a Maildir's cur/ and new/."""
    out = {}
    for sub in ("cur", "new"):
        d = os.path.join(root, sub)
        if not os.path.isdir(d):
            continue
        for n in os.listdir(d):
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                data = f.read()
            for ln in data.splitlines():
                if ln.startswith(b"Message-ID:"):
                    out[ln.split()[1]] = (p, data)
                    break
    return out


def lf(data):
    return data.replace(b"\r\n", b"\n")


def without_tuid(data):
    """`data` without the one "X-TUID: ..." header line mbsync adds to what it stores."""
    head, sep, body = data.partition(b"\n\n")
    lines = head.split(b"\n")
    kept = [ln for ln in lines if not re.match(rb"X-TUID: [A-Za-z0-9+/]+$", ln)]
    return b"\n".join(kept) + sep + body if len(lines) - len(kept) == 1 else data


def first_difference(a, b):
    """Where a and b first differ, with a few bytes of each around it."""
    i = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    return i, a[max(0, i - 20):i + 20], b[max(0, i - 20):i + 20]


def set_maildir_flags(path, flags):
    """Renames a Maildir message to carry `flags` (e.g. "FS"), into cur/."""
    base = os.path.basename(path).split(":2,")[0]
    dest = os.path.join(os.path.dirname(os.path.dirname(path)), "cur", base + ":2," + "".join(sorted(flags)))
    os.rename(path, dest)
    return dest


def run(cmd, env=None, timeout=30):
    try:
        return subprocess.run(cmd, capture_output=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, -1, e.stdout or b"", (e.stderr or b"") + b" (timed out)")


def mbsyncrc(work, name, port, dc):
    """An mbsyncrc whose channel "inbox" syncs INBOX through 127.0.0.1:port into work/name."""
    local = os.path.join(work, name)
    os.makedirs(local, exist_ok=True)
    rc = os.path.join(work, name + ".rc")
    with open(rc, "w") as f:
        f.write(f"""IMAPAccount ghost
Host 127.0.0.1
Port {port}
User {dc.user}
Pass "{dc.password}"
SSLType None
AuthMechs LOGIN PLAIN
Timeout 20

IMAPStore remote
Account ghost

MaildirStore local
Path {local}/
Inbox {local}/INBOX

Channel inbox
Far :remote:INBOX
Near :local:INBOX
Create Near
Expunge Both
Sync All
SyncState *
""")
    return rc


def offlineimaprc(work, name, port, dc):
    """An offlineimaprc syncing INBOX through 127.0.0.1:port into work/name."""
    rc = os.path.join(work, name + ".rc")
    with open(rc, "w") as f:
        f.write(f"""[general]
accounts = ghost
metadata = {work}/{name}-meta
ui = basic

[Account ghost]
localrepository = local
remoterepository = remote

[Repository local]
type = Maildir
localfolders = {os.path.join(work, name)}

[Repository remote]
type = IMAP
remotehost = 127.0.0.1
remoteport = {port}
remoteuser = {dc.user}
remotepass = {dc.password}
ssl = no
starttls = no
folderfilter = lambda f: f == 'INBOX'
""")
    return rc


def skip(t, n, why):
    """Skips the next n checks."""
    t.skip_rest(t.n + n, why)


def main():
    h.require_root_and_fuse()
    dc = h.started_dovecot()
    t = h.Tap(PLAN)
    sent = [message(i, s) for i, s in enumerate(SUBJECTS)]
    for m in sent:
        dc.seed("", m)
    server = Server(dc)
    work = h.tempdir()
    fs, mnt, ctl = h.mount_origin(t, PLAN, work, {"mail": dc.url()},
                                  args=["--password-file", f"mail={dc.password_file()}", "--profile", "ipaq-2004"])
    iport = h.free_port()
    exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
    plog = os.path.join(work, "ghostproxy.log")
    proxy = subprocess.Popen([exe, "--listen", f"127.0.0.1:{h.free_port()}", "--mount", mnt, "--control", ctl,
                              "--imap-listen", f"127.0.0.1:{iport}",
                              "--imap-origin", f"imap://127.0.0.1:{dc.port}/"],
                             stdout=open(plog, "w"), stderr=subprocess.STDOUT)
    h.on_exit(lambda: proxy.poll() is None and (proxy.terminate(), proxy.wait(10)))
    # A second proxy that defers changes (imap_journal) while ghostfs's card is in PSM.
    jport = h.free_port()
    jlog = os.path.join(work, "ghostproxy-journal.log")
    journal = os.path.join(work, "imap-journal")
    jproxy = subprocess.Popen([exe, "--listen", f"127.0.0.1:{h.free_port()}", "--mount", mnt, "--control", ctl,
                               "--imap-listen", f"127.0.0.1:{jport}", "--imap-journal", journal,
                               "--imap-origin", f"imap://127.0.0.1:{dc.port}/"],
                              stdout=open(jlog, "w"), stderr=subprocess.STDOUT)
    h.on_exit(lambda: jproxy.poll() is None and (jproxy.terminate(), jproxy.wait(10)))
    if not t.check(h.wait_port(iport, 15), "ghostproxy listens for IMAP", open(plog).read()[-500:]):
        t.skip_rest(PLAN, "no IMAP proxy")
        t.done()
    before = server.state()
    t.check(sorted(b for _, b in before.values()) == sorted(sent), "dovecot holds the seeded messages")
    home = os.path.join(work, "home")
    os.makedirs(home)
    env = dict(os.environ, HOME=home)

    # mbsync: INBOX to a local Maildir through the proxy, then local changes back.
    if not shutil.which("mbsync"):
        skip(t, 3, "mbsync (isync) is not installed")
    else:
        local = os.path.join(work, "mbsync")
        os.makedirs(local)
        rc = mbsyncrc(work, "mbsync", iport, dc)
        r = run(["mbsync", "-c", rc, "inbox"], env=env)
        got = maildir_messages(os.path.join(local, "INBOX"))
        # mbsync writes a Maildir's Unix line ends (CRLF -> LF) and adds its X-TUID header line
        # (it does so syncing from dovecot directly too); every other byte must be the server's.
        want = {k: lf(v[1]) for k, v in before.items()}
        have = {k: without_tuid(v[1]) for k, v in got.items()}
        ok = r.returncode == 0 and have == want
        differ = [(k, len(v), len(want.get(k, b"")), first_difference(v, want.get(k, b"")))
                  for k, v in have.items() if v != want.get(k, b"")]
        t.check(ok, "mbsync through the proxy: the local bodies are dovecot's, byte for byte "
                "(CRLF as LF, mbsync's X-TUID line aside)",
                f"rc {r.returncode} {sorted(got)} differ (id, local, server, at): {differ}\n"
                f"{r.stdout[-600:]!r} {r.stderr[-800:]!r}\n"
                + open(plog).read()[-800:])
        if ok:
            flag_id, gone_id = b"<c0@ghost.test>", b"<c1@ghost.test>"
            set_maildir_flags(got[flag_id][0], "FS")
            os.unlink(got[gone_id][0])
            r = run(["mbsync", "-c", rc, "inbox"], env=env)
            after = server.state()
            t.check(r.returncode == 0 and flag_id in after and b"\\Flagged" in after[flag_id][0]
                    and b"\\Seen" in after[flag_id][0],
                    "mbsync: a flag change made locally lands on the server",
                    f"rc {r.returncode} {after.get(flag_id, (None,))[0]!r} {r.stderr[-600:]!r}")
            t.check(r.returncode == 0 and gone_id not in after and len(after) == len(before) - 1,
                    "mbsync: a message deleted locally is expunged on the server",
                    f"{sorted(after)} {r.stderr[-600:]!r}\n" + open(plog).read()[-800:])
        else:
            skip(t, 2, "the first mbsync failed")

    # offlineimap3: the same, on what is left.
    oi = shutil.which("offlineimap3") or shutil.which("offlineimap")
    if not oi:
        skip(t, 3, "offlineimap3 is not installed")
    else:
        local = os.path.join(work, "offlineimap")
        rc = offlineimaprc(work, "offlineimap", iport, dc)
        now = server.state()
        r = run([oi, "-c", rc, "-o", "-u", "basic"], env=env, timeout=40)
        got = maildir_messages(os.path.join(local, "INBOX"))
        # offlineimap writes a Maildir's Unix line ends too.
        want = {k: lf(v[1]) for k, v in now.items()}
        have = {k: v[1] for k, v in got.items()}
        ok = r.returncode == 0 and have == want
        t.check(ok, "offlineimap3 through the proxy: the local bodies are dovecot's, byte for byte (CRLF as LF)",
                f"rc {r.returncode} {sorted(got)} {r.stdout[-800:]!r} {r.stderr[-800:]!r}\n"
                + open(plog).read()[-800:])
        if ok:
            flag_id, gone_id = b"<c2@ghost.test>", b"<c3@ghost.test>"
            set_maildir_flags(got[flag_id][0], "FR")
            os.unlink(got[gone_id][0])
            r = run([oi, "-c", rc, "-o", "-u", "basic"], env=env, timeout=40)
            after = server.state()
            t.check(r.returncode == 0 and flag_id in after and b"\\Flagged" in after[flag_id][0]
                    and b"\\Answered" in after[flag_id][0],
                    "offlineimap3: a flag change made locally lands on the server",
                    f"rc {r.returncode} {after.get(flag_id, (None,))[0]!r} {r.stderr[-600:]!r}")
            t.check(r.returncode == 0 and gone_id not in after and len(after) == len(now) - 1,
                    "offlineimap3: a message deleted locally is expunged on the server",
                    f"{sorted(after)} {r.stderr[-600:]!r}\n" + open(plog).read()[-800:])
        else:
            skip(t, 2, "the first offlineimap run failed")

    # mbsync through the deferring proxy (card in PSM): a flag change is answered at once and
    # waits in the journal; `ghostctl flush` sends it to the server.
    if not shutil.which("mbsync"):
        skip(t, 6, "mbsync (isync) is not installed")
    elif not t.check(h.wait_port(jport, 15), "the deferring proxy listens", open(jlog).read()[-500:]):
        skip(t, 5, "no deferring proxy")
    else:
        rc = mbsyncrc(work, "mbsync-deferred", jport, dc)
        r = run(["mbsync", "-c", rc, "inbox"], env=env)
        got = maildir_messages(os.path.join(work, "mbsync-deferred", "INBOX"))
        flag_id = b"<c5@ghost.test>"
        if t.check(r.returncode == 0 and flag_id in got, "mbsync syncs through the deferring proxy",
                   f"rc {r.returncode} {sorted(got)} {r.stderr[-600:]!r}\n" + open(jlog).read()[-600:]):
            set_maildir_flags(got[flag_id][0], "F")
            time.sleep(1.5)  # the card back in PSM after the first sync's body transfers
            r = run(["mbsync", "-c", rc, "inbox"], env=env)
            waiting = server.state().get(flag_id, (b"",))[0]
            with open(journal, "rb") as jf:
                queued = jf.read()
            t.check(r.returncode == 0 and b"\\Flagged" not in waiting and b"Flagged" in queued,
                    "mbsync: its flag change is answered at once and waits in the proxy's journal",
                    f"rc {r.returncode} server {waiting!r} journal {queued[-300:]!r} {r.stderr[-400:]!r}")
            ghostctl = os.path.join(h.build_dir(), "fs", "ghostctl")
            subprocess.run([ghostctl, "--control", ctl, "flush"], capture_output=True, timeout=30)
            landed = h.wait_for(lambda: b"\\Flagged" in server.state().get(flag_id, (b"",))[0], timeout=10)
            t.check(landed, "mbsync: after ghostctl flush the deferred flag change is on the server",
                    open(jlog).read()[-600:])
            # A local deletion: mbsync's \\Deleted and its expunge are answered at once and wait;
            # the flush expunges the message on the server. The card must still be in PSM when
            # the expunge arrives; mbsync's own transfers can switch it to CAM first (seen once
            # in the whole suite under the sanitizers), and then the expunge rightly goes to the
            # server at once. So up to three tries, each with a new message: the check fails
            # only if no deletion waited, or one was not expunged by the flush.
            tries = []
            for attempt in range(3):
                del_id = f"<c6.{attempt}@ghost.test>".encode()
                dc.seed("", b"From: a@ghost.test\r\nTo: b@ghost.test\r\nSubject: Golf extra\r\n"
                            b"Message-ID: " + del_id + b"\r\n\r\nTo be deleted locally.\r\n")
                run(["mbsync", "-c", rc, "inbox"], env=env)
                got = maildir_messages(os.path.join(work, "mbsync-deferred", "INBOX"))
                if del_id in got:
                    os.unlink(got[del_id][0])
                time.sleep(1.5)  # the card back in PSM
                r = run(["mbsync", "-c", rc, "inbox"], env=env)
                waited = del_id in server.state()
                subprocess.run([ghostctl, "--control", ctl, "flush"], capture_output=True, timeout=30)
                gone = h.wait_for(lambda: del_id not in server.state() or None, timeout=10)
                tries.append((r.returncode, waited, bool(gone)))
                if r.returncode != 0 or not gone or waited:
                    break
            t.check(all(code == 0 and gone for code, _, gone in tries) and any(w for _, w, _ in tries),
                    "mbsync: a local deletion through the deferring proxy waits, and the flush expunges it",
                    f"tries (rc, waited, gone) {tries} {r.stderr[-400:]!r}\n" + open(jlog).read()[-600:])
        else:
            skip(t, 3, "the first mbsync run through the deferring proxy failed")
        # A deferred \\Deleted is sent before a CLOSE (which expunges it on the server).
        gone_id = b"<c0@ghost.test>"
        time.sleep(1.5)  # the card back in PSM
        c = imaplib.IMAP4("127.0.0.1", jport)
        c.login(dc.user, dc.password)
        c.select("INBOX")
        u = c.uid("SEARCH", None, "HEADER", "Message-ID", "c0@ghost.test")[1][0].split()[0]
        c.uid("FETCH", u, "(FLAGS)")
        typ, data = c.uid("STORE", u, "+FLAGS", "(\\Deleted)")
        with open(journal, "rb") as jf:
            held = gone_id in server.state() and b"Deleted" in jf.read()
        c.close()
        c.logout()
        # (Only this message's flags are known: the CLOSE cannot be deferred and sends the queue.)
        t.check(held and gone_id not in server.state(),
                "a deferred \\Deleted is sent before CLOSE, which expunges the message on the server",
                f"{typ} {data} deferred {held}\n" + open(jlog).read()[-600:])

    # offlineimap3 through the deferring proxy (card in PSM): marking a message read, flagging
    # one and deleting one locally are answered at once and wait in the journal; the flush
    # takes them to dovecot; a third run sees a consistent state (no download again, no copy).
    oi = shutil.which("offlineimap3") or shutil.which("offlineimap")
    if not oi:
        skip(t, 4, "offlineimap3 is not installed")
    elif not h.wait_port(jport, 15):
        skip(t, 4, "no deferring proxy")
    else:
        ids = [f"<oi.{k}@ghost.test>".encode() for k in ("seen", "flag", "del")]
        for mid, k in zip(ids, ("seen", "flag", "del")):
            dc.seed("", b"From: a@ghost.test\r\nTo: b@ghost.test\r\nSubject: offlineimap " + k.encode() +
                    b"\r\nMessage-ID: " + mid + b"\r\n\r\nA message offlineimap3 changes.\r\n")
        rc = offlineimaprc(work, "offlineimap-deferred", jport, dc)
        local = os.path.join(work, "offlineimap-deferred", "INBOX")
        r = run([oi, "-c", rc, "-o", "-u", "basic"], env=env, timeout=60)
        got = maildir_messages(local)
        if t.check(r.returncode == 0 and all(m in got for m in ids), "offlineimap3 syncs through the deferring proxy",
                   f"rc {r.returncode} {sorted(got)} {r.stdout[-400:]!r} {r.stderr[-600:]!r}\n" + open(jlog).read()[-600:]):
            seen_id, flag_id, del_id = ids
            set_maildir_flags(got[seen_id][0], "S")
            set_maildir_flags(got[flag_id][0], "F")
            os.unlink(got[del_id][0])
            with open(journal, "rb") as jf:
                journal_before = len(jf.read())
            time.sleep(1.5)  # the card back in PSM after the first sync's body transfers
            dbg = ["-d", "imap"] if os.environ.get("GHOST_OI_DEBUG") else []
            r = run([oi, "-c", rc, "-o", "-u", "basic", *dbg], env=env, timeout=60)
            if dbg:
                open("/tmp/imap8-oi-debug.txt", "wb").write(r.stdout + r.stderr)
            waiting = server.state()
            with open(journal, "rb") as jf:
                queued = jf.read()[journal_before:]
            t.check(r.returncode == 0 and b"\\Seen" not in waiting[seen_id][0]
                    and b"\\Flagged" not in waiting[flag_id][0] and del_id in waiting
                    and b"Seen" in queued and b"Flagged" in queued and b"Deleted" in queued,
                    "offlineimap3: mark read, flag and delete are answered at once and wait in the proxy's journal",
                    f"rc {r.returncode} server {[(m, waiting.get(m, (b'-',))[0]) for m in ids]} journal "
                    f"{queued[-400:]!r} {r.stderr[-400:]!r}\n" + open(jlog).read()[-600:])
            ghostctl = os.path.join(h.build_dir(), "fs", "ghostctl")
            subprocess.run([ghostctl, "--control", ctl, "flush"], capture_output=True, timeout=30)

            def landed():
                st = server.state()
                ok = (seen_id in st and b"\\Seen" in st[seen_id][0] and flag_id in st
                      and b"\\Flagged" in st[flag_id][0] and del_id not in st)
                return st if ok else None
            after = h.wait_for(landed, timeout=15)
            t.check(after is not None, "offlineimap3: after ghostctl flush dovecot has the read, the flag and the deletion",
                    open(jlog).read()[-800:])
            files_before = sorted(os.path.basename(p).split(":2,")[0] for p, _ in maildir_messages(local).values())
            r = run([oi, "-c", rc, "-o", "-u", "basic"], env=env, timeout=60)
            mine = maildir_messages(local)
            nfiles = sum(len(os.listdir(os.path.join(local, sub))) for sub in ("cur", "new")
                         if os.path.isdir(os.path.join(local, sub)))
            files_after = sorted(os.path.basename(p).split(":2,")[0] for p, _ in mine.values())
            final = server.state()

            def local_flags(mid):
                return os.path.basename(mine[mid][0]).split(":2,")[-1] if mid in mine else None
            t.check(r.returncode == 0 and sorted(mine) == sorted(final) and nfiles == len(final)
                    and files_after == files_before and local_flags(seen_id) == "S" and local_flags(flag_id) == "F",
                    "offlineimap3: the next run sees a consistent state (same messages as dovecot, nothing "
                    "downloaded again, no copy, the flags kept)",
                    f"rc {r.returncode} local {sorted(mine)} ({nfiles} files) server {sorted(final)} "
                    f"renamed {set(files_after) ^ set(files_before)} flags {local_flags(seen_id)} {local_flags(flag_id)} "
                    f"{r.stderr[-400:]!r}\n" + open(jlog).read()[-600:])
        else:
            skip(t, 3, "the first offlineimap3 run through the deferring proxy failed")

    # curl imap:// FETCH of a body by UID, through the proxy.
    d = imaplib.IMAP4("127.0.0.1", dc.port)
    d.login(dc.user, dc.password)
    d.select("INBOX", readonly=True)
    uid = d.uid("SEARCH", None, "HEADER", "Message-ID", "c4@ghost.test")[1][0].split()[0].decode()
    d.logout()
    r = run(["curl", "-s", "--max-time", "20", "-u", f"{dc.user}:{dc.password}",
             f"imap://127.0.0.1:{iport}/INBOX;UID={uid}"])
    t.check(r.returncode == 0 and r.stdout == sent[4], "curl imap:// fetches a body through the proxy, byte-identical",
            f"rc {r.returncode} {len(r.stdout)} bytes {r.stderr[-300:]!r}")

    # A body read whole from the cache once is kept in the proxy's RAM and answered from there
    # with no round trip to ghostfs (as HTTP hits are): with ghostfs stopped (SIGSTOP), the
    # next fetch of it is still answered at once, from the cache.
    def fetch_once(timeout):
        try:
            s = socket.create_connection(("127.0.0.1", iport), timeout=timeout)
            out = b""
            # One command at a time (the proxy answers a fetch sent with nothing outstanding).
            for tag, cmd in (("a", f'LOGIN {dc.user} "{dc.password}"'), ("b", "SELECT INBOX"),
                             ("c", f"UID FETCH {uid} BODY.PEEK[]"), ("d", "LOGOUT")):
                s.sendall(f"{tag} {cmd}\r\n".encode())
                while f"\r\n{tag} ".encode() not in out:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    out += chunk
            s.close()
            return out
        except OSError as e:
            return repr(e).encode()
    hits = 0
    deadline = time.time() + 15
    while hits < 3 and time.time() < deadline:
        hits += b"(Ghost: from the cache)" in fetch_once(10)
    os.kill(fs.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.time()
        out = fetch_once(5)
        took = time.time() - t0
    finally:
        os.kill(fs.proc.pid, signal.SIGCONT)
    t.check(hits == 3 and b"(Ghost: from the cache)" in out and sent[4] in out and took < 2,
            "a body read whole from the cache is answered from the proxy's RAM (ghostfs stopped)",
            f"{hits} hits before; {took:.2f} s; {out[-300:]!r}\n" + open(plog).read()[-500:])

    # neomutt with imap:// in tmux: the index lists the messages, one opens.
    if not (shutil.which("neomutt") and shutil.which("tmux")):
        skip(t, 2, "neomutt or tmux is not installed")
    else:
        muttrc = os.path.join(work, "muttrc")
        with open(muttrc, "w") as f:
            f.write(f"""set folder = "imap://{dc.user}@127.0.0.1:{iport}/"
set spoolfile = "+INBOX"
set imap_pass = "{dc.password}"
set ssl_starttls = no
set ssl_force_tls = no
set imap_passive = no
set header_cache = ""
set message_cachedir = ""
set sort = date
set mark_old = no
set wait_key = no
set pager_index_lines = 0
set quit = yes
set move = no
""")
        tm = h.Tmux("ghost-imapc")

        cmd = f"env HOME={home} TERM=screen neomutt -n -F {muttrc}"
        r = tm.start(cmd)
        left = [SUBJECTS[i] for i in (2, 4, 5)]
        ok, text = tm.wait_screen(lambda s: all(x in s for x in left))
        t.check(r.returncode == 0 and ok, "neomutt imap:// through the proxy lists the messages",
                f"{r.stderr}\n{text}\n" + open(plog).read()[-600:])
        # The cursor is on the first unread message; whichever it is, its subject and body agree.
        tm.keys("Enter")

        def shown(text):
            return [i for i, subj in enumerate(SUBJECTS)
                    if f"Subject: {subj}" in text and f"This is the body of message number {i}." in text]
        ok, text = tm.wait_screen(lambda s: len(shown(s)) == 1)
        t.check(ok, "neomutt displays a message read through the proxy (subject and body)",
                text + open(plog).read()[-600:])
        tm.keys("q")
        tm.keys("q")
        deadline = time.time() + 10
        while time.time() < deadline and tm.run("has-session", "-t", "ghost").returncode == 0:
            time.sleep(0.2)
        tm.run("kill-server")
    t.check(proxy.poll() is None, "the proxy is still up after every client", open(plog).read()[-500:])
    t.done()


if __name__ == "__main__":
    # meson stops the test at 180 s: before that, a hang reports where it waits
    with h.Watchdog(150, h.tracked_alive):
        main()
