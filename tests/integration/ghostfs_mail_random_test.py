#!/usr/bin/env python3
"""ghostfs's mail/ (IMAP as Maildir, DESIGN §4.4) under random, seeded, concurrent use against a
real dovecot on loopback, while another IMAP client changes the same mailboxes on the server.

Mount-side workers do what Maildir clients do: read messages (the bytes must be the message's),
rename new/→cur/ and cur/→cur/ with flag suffixes (:2,FRST), unlink (moves to Trash), deliver
through tmp/ + rename into new/ (APPEND), move to another folder (UID MOVE). A server-side
client (imaplib) APPENDs, STOREs +/-FLAGS, UID MOVEs and UID EXPUNGEs at the same time. A
flipper changes the knob, flushes and sends ghost hints. In about half the rounds the daemon is
SIGKILLed in the middle of all this and mounted again over the same cache (the queue's journal
is replayed): every delivery whose rename returned must reach the server, one the kill cut may
or may not, but at most once.

After each quiet point (workers stopped, `ghostctl sync`, the listings refreshed):
- every operation on a valid name either worked or failed with ENOENT (raced by another
  client); never EIO, never a hang, the daemon alive;
- every message anyone created is in exactly one mailbox, unless the server client expunged it
  (then at most one): nothing lost, nothing duplicated; except that a message both the mount and
  the server client moved may be in two (dovecot's Maildir storage copies a message once for each
  of two sessions that MOVE it at once; printed as a comment, never more than two);
- each mailbox as the mount shows it equals the server's: same messages, same bytes, and flags
  (info letters D F R S T = \\Draft \\Flagged \\Answered \\Seen \\Deleted) the same;
- the cache's index passes `PRAGMA integrity_check`.

The seed is printed first; replay: ghostfs_mail_random_test.py --seed S [--rounds N --secs S].
Skipped without root, /dev/fuse or dovecot."""
import errno
import imaplib
import os
import random
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

FOLDERS = {"INBOX": "", "Work": ".Work", "Archive": ".Archive", "Trash": ".Trash"}
LETTER = {"\\Draft": "D", "\\Flagged": "F", "\\Answered": "R", "\\Seen": "S", "\\Deleted": "T"}
TAG = re.compile(rb"Subject: (\S+)\r\n")


def message(tag):
    """The bytes of message `tag`: deterministic, so any reader can check what it got."""
    r = random.Random(tag)
    size = r.choice([400, 900, 2500, 7000, 30000])
    head = (f"From: a@example.org\r\nTo: b@example.org\r\nSubject: {tag}\r\n"
            f"Message-ID: <{tag}@ghost.test>\r\nDate: Mon, 1 Jan 2024 10:00:00 +0000\r\n\r\n")
    line = f"{tag} " + "".join(r.choice("abcdefghij") for _ in range(60)) + "\r\n"
    body = (line * (size // len(line) + 1))[: max(0, size - len(head))]
    return (head + body).encode()


def describe(data, tag):
    """How `data` differs from message `tag`: sizes, first differing byte, whose lines it holds."""
    want = message(tag) if tag else b""
    diff = next((i for i in range(min(len(data), len(want))) if data[i] != want[i]), min(len(data), len(want)))
    owners = sorted({ln.split(b" ")[0].decode(errors="replace") for ln in data.split(b"\r\n")[6:] if ln})[:6]
    return f"want {len(want)} bytes, first difference at {diff}, lines of {owners}"


def tag_of(data):
    m = TAG.search(data[:400])
    return m.group(1).decode() if m else None


class Shared:
    def __init__(self):
        self.lock = threading.Lock()
        self.created = set()     # every tag anyone created (seeded, delivered, appended)
        self.expunged = set()    # tags the server client may have expunged
        self.maybe = set()       # deliveries whose rename the SIGKILL cut: on the server at most once
        # tag -> who moved it ("mount": a rename to another folder or an unlink, i.e. a UID MOVE
        # ghostfs sends; "server": the server client's UID MOVE). dovecot's Maildir storage does
        # a MOVE as a copy and an expunge, and two sessions moving one message at once both copy
        # it (124 of 150 tries, two imaplib sessions, stop 24): a message both moved may be on
        # the server twice, which is dovecot's doing, not the mount's.
        self.moved_by = {}
        self.killed = threading.Event()  # the daemon was killed mid-round: errors are expected
        self.errors = []         # what must never happen
        self.counts = {}

    def moved(self, tag, who):
        if tag:
            with self.lock:
                self.moved_by.setdefault(tag, set()).add(who)

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1


def head_tag(path):
    """The tag of the message at `path` (its Subject), read before the mount moves it."""
    with open(path, "rb") as f:
        return tag_of(f.read(400))


def allowed(e):
    """ENOENT: the name was changed or removed by another client meanwhile; ESTALE: a read of a
    message another client expunged after it was opened (DESIGN §4.4)."""
    return e.errno in (errno.ENOENT, errno.ESTALE)


def mount_worker(w, seed, secs, mnt, sh, deadline_note):
    rng = random.Random(seed * 100 + w)
    root = os.path.join(mnt, "mail")
    n = 0
    end = time.time() + secs
    while time.time() < end:
        folder = rng.choice(list(FOLDERS.values()))
        fdir = os.path.join(root, folder) if folder else root
        op = rng.choice(["read", "read", "flag", "flag", "seen", "delete", "deliver", "deliver", "move"])
        n += 1
        try:
            if op == "deliver":
                tag = f"m{w}x{seed}x{n}"
                data = message(tag)
                with sh.lock:
                    sh.maybe.add(tag)
                tmp = os.path.join(fdir, "tmp", f"{tag}.host")
                with open(tmp, "wb") as f:
                    f.write(data)
                os.rename(tmp, os.path.join(fdir, "new", f"{tag}.host"))
                with sh.lock:  # the rename returned: the message must reach the server
                    sh.created.add(tag)
                    sh.maybe.discard(tag)
                sh.count("deliver")
                continue
            sub = rng.choice(["cur", "cur", "new"]) if op != "seen" else "new"
            names = sorted(os.listdir(os.path.join(fdir, sub)))
            if not names:
                continue
            name = rng.choice(names)
            path = os.path.join(fdir, sub, name)
            base = name.split(":2,")[0]
            if op == "read":
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError as e:
                    if allowed(e):
                        continue
                    raise
                tag = tag_of(data)
                if tag is None or data != message(tag):
                    with sh.lock:
                        sh.errors.append(f"read {folder}/{sub}/{name}: {len(data)} bytes, not the message {tag}"
                                         f" ({describe(data, tag)})")
                sh.count("read")
            elif op in ("flag", "seen"):
                info = "".join(sorted(rng.sample("FRST", rng.randint(0, 3))))
                if op == "seen" and "S" not in info:
                    info = "".join(sorted(info + "S"))
                os.rename(path, os.path.join(fdir, "cur", f"{base}:2,{info}"))
                sh.count(op)
            elif op == "delete":
                if folder == ".Trash":
                    continue  # an expunge there would need the tag; the server client does those
                tag = head_tag(path)
                os.unlink(path)
                sh.moved(tag, "mount")
                sh.count("delete")
            elif op == "move":
                other = rng.choice([f for f in FOLDERS.values() if f != folder])
                odir = os.path.join(root, other) if other else root
                tag = head_tag(path)
                os.rename(path, os.path.join(odir, "cur", name if ":2," in name else name + ":2,"))
                sh.moved(tag, "mount")
                sh.count("move")
        except OSError as e:
            if sh.killed.is_set():
                return  # the daemon is gone: what did not return is not counted
            if allowed(e):
                sh.count(op + "-enoent")
                continue
            with sh.lock:
                sh.errors.append(f"worker {w} {op} in {folder or 'INBOX'}: {e}")
            if e.errno in (errno.ENOTCONN, errno.ECONNABORTED):
                return


def server_worker(seed, secs, dc, sh):
    rng = random.Random(seed * 100 + 99)
    c = dc.login()
    n = 0
    end = time.time() + secs
    while time.time() < end:
        box = rng.choice(list(FOLDERS))
        op = rng.choice(["append", "append", "store", "store", "move", "expunge"])
        n += 1
        try:
            if op == "append":
                tag = f"s{seed}x{n}"
                with sh.lock:
                    sh.created.add(tag)
                flags = " ".join(rng.sample(list(LETTER), rng.randint(0, 2)))
                typ, _ = c.append(box, f"({flags})", None, message(tag))
                if typ != "OK":
                    sh.errors.append(f"server APPEND {tag}: {typ}")
                sh.count("s-append")
                continue
            c.select(box)
            typ, data = c.uid("SEARCH", None, "ALL")
            uids = data[0].split()
            if not uids:
                continue
            uid = rng.choice(uids).decode()
            if op == "store":
                flag = rng.choice(list(LETTER))
                c.uid("STORE", uid, rng.choice(["+FLAGS", "-FLAGS"]), f"({flag})")
                sh.count("s-store")
            elif op == "move":
                other = rng.choice([b for b in FOLDERS if b != box])
                typ, d = c.uid("FETCH", uid, "(BODY.PEEK[HEADER.FIELDS (SUBJECT)])")
                tag = tag_of(d[0][1] + b"\r\n") if d and isinstance(d[0], tuple) else None
                c.uid("MOVE", uid, other)
                sh.moved(tag, "server")
                sh.count("s-move")
            elif op == "expunge":
                typ, d = c.uid("FETCH", uid, "(BODY.PEEK[HEADER.FIELDS (SUBJECT)])")
                tag = tag_of(d[0][1] + b"\r\n") if d and isinstance(d[0], tuple) else None
                if tag:
                    with sh.lock:
                        sh.expunged.add(tag)
                    c.uid("STORE", uid, "+FLAGS", "(\\Deleted)")
                    c.uid("EXPUNGE", uid)
                    sh.count("s-expunge")
            time.sleep(rng.uniform(0, 0.05))
        except (imaplib.IMAP4.error, OSError) as e:
            sh.errors.append(f"server client {op}: {e}")
            c = dc.login()
    c.logout()


def flipper(seed, secs, ctl, sh):
    rng = random.Random(seed * 100 + 77)
    try:
        c = h.Control(ctl)
    except OSError as e:
        sh.errors.append(f"control: {e}")
        return
    end = time.time() + secs
    while time.time() < end:
        time.sleep(rng.uniform(0.05, 0.5))
        what = rng.choice(["knob", "knob", "flush", "hints"])
        try:
            if what == "knob":
                c.ok("knob", knob=rng.choice([0, 0, 1, 50, 100]))
            elif what == "hints":
                c.ghost_hints(n=rng.choice([1, 20]))
            else:
                c.ok("flush")
            sh.count("p-" + what)
        except (OSError, ValueError, RuntimeError) as e:
            if not sh.killed.is_set():
                sh.errors.append(f"power {what}: {e}")
            return
    c.close()


def ghostctl(ctl, *args, timeout=60):
    return h.ghostctl(ctl, "--json", *args, timeout=timeout)


NAME = re.compile(r"^(\d+)\.(\d+)\.ghost,S=(\d+)(?::2,(.*))?$")


def mount_view(mnt):
    """{box: {name: (uidvalidity, uid, size, letters, path)}} as the mount lists it (names only)."""
    out = {}
    for box, folder in FOLDERS.items():
        fdir = os.path.join(mnt, "mail", folder) if folder else os.path.join(mnt, "mail")
        msgs = {}
        for sub in ("cur", "new"):
            for name in os.listdir(os.path.join(fdir, sub)):
                m = NAME.match(name)
                letters = "".join(sorted(c for c in (m.group(4) or "") if c.isupper())) if m else ""
                msgs[name] = ((int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None, letters,
                              os.path.join(fdir, sub, name))
        out[box] = msgs
    return out


def imap_lines(log):
    """The daemons' lines (every run of the mount: one log) about queued IMAP operations: kept,
    found, moved on, dropped, refused, re-targeted, appended again."""
    words = ("IMAP", "queued", "UIDVALIDITY", "APPEND", "replaying")
    return [line for line in log.splitlines() if any(w in line for w in words)]


def server_view(dc):
    """{box: (uidvalidity, {uid: (letters, bytes)})} as dovecot holds them."""
    out = {}
    c = dc.login()
    for box in FOLDERS:
        msgs = {}
        typ, _ = c.select(box, readonly=True)
        v = int(c.response("UIDVALIDITY")[1][0])
        typ, data = c.uid("FETCH", "1:*", "(UID FLAGS BODY.PEEK[])")
        for item in data:
            if isinstance(item, tuple):
                uid = int(re.search(rb"UID (\d+)", item[0]).group(1))
                flags = imaplib.ParseFlags(item[0])
                letters = "".join(sorted(LETTER[f.decode()] for f in flags if f.decode() in LETTER))
                msgs[uid] = (letters, item[1])
        out[box] = (v, msgs)
    c.logout()
    return out


def compare(sh, mv, sv, rng, sample=25):
    """What is wrong, as a list of lines. Every message's name (UIDVALIDITY, UID, size, flags)
    against the server's; the bytes of `sample` random messages read through the mount."""
    bad = []
    where = {}
    for box, (_, msgs) in sv.items():
        for uid, (_, body) in msgs.items():
            where.setdefault(tag_of(body), []).append(box)
    with sh.lock:
        created, expunged = set(sh.created), set(sh.expunged)
        both_moved = {tag for tag, who in sh.moved_by.items() if who == {"mount", "server"}}
    raced = sorted(tag for tag in created if len(where.get(tag, [])) == 2 and tag in both_moved)
    if raced:
        print(f"# on the server twice after both clients moved them (dovecot's MOVE race, Shared.moved_by): "
              f"{[(tag, where[tag]) for tag in raced]}", flush=True)
    for tag in sorted(created):
        n = len(where.get(tag, []))
        if tag in raced:
            continue
        if n > 1 or (n == 0 and tag not in expunged):
            bad.append(f"{tag}: on the server in {where.get(tag, [])} (expunged by the server client: {tag in expunged})")
    with sh.lock:
        maybe = set(sh.maybe)
    for tag in sorted(maybe):
        if len(where.get(tag, [])) > 1:
            bad.append(f"{tag} (delivered as the daemon was killed): on the server in {where[tag]}")
    for tag in where:
        if tag not in created and tag not in maybe:
            bad.append(f"{tag}: on the server, never created")
    to_read = []
    for box in FOLDERS:
        v, smsgs = sv[box]
        got = {}
        for name, (key, letters, path) in mv[box].items():
            if key is None or key[0] != v:
                bad.append(f"{box}: the mount shows {name}, not a name of UIDVALIDITY {v}")
                continue
            got[key[1]] = (key[2], letters, path)
        for uid in sorted(set(got) | set(smsgs)):
            m, srv = got.get(uid), smsgs.get(uid)
            if m is None or srv is None or m[0] != len(srv[1]) or m[1] != srv[0]:
                bad.append(f"{box} UID {uid} ({tag_of(srv[1]) if srv else '?'}): mount {m and m[:2]} "
                           f"server {srv and (len(srv[1]), srv[0])}")
            else:
                to_read.append((m[2], srv[1]))
    for path, body in rng.sample(to_read, min(sample, len(to_read))):
        with open(path, "rb") as f:
            data = f.read()
        if data != body:
            bad.append(f"{path}: {len(data)} bytes read, not the server's {len(body)} ({describe(data, tag_of(body))})")
    return bad


def two_readers(t, dc, work, seed):
    """The minimal case behind round one's wrong body: two readers, each in its own mailbox,
    listing it and reading its messages (bodies not cached yet), at the same time. Each
    mailbox's messages have their own sizes, so a name from the other mailbox shows."""
    rng = random.Random(seed)
    boxes = {"Left": [], "Right": []}
    c = dc.login()
    for box in boxes:
        c.create(box)
        for i in range(40):
            tag = f"{box[0]}{i}"
            boxes[box].append(tag)
            c.append(box, "(\\Seen)", None, message(tag))
    c.logout()
    sizes = {box: {len(message(tg)) for tg in tags} for box, tags in boxes.items()}
    mnt, cache = os.path.join(work, "mnt-two"), os.path.join(work, "cache-two")
    os.makedirs(mnt)
    conf = os.path.join(work, "two.toml")
    with open(conf, "w") as f:
        f.write("heuristic_freshness = 1\n")
    fs = h.Ghostfs(mnt, cache, {"mail": dc.url()}, args=["--password-file", f"mail={dc.password_file()}", "--config", conf])
    if not fs.start():
        return t.check(False, "two readers: mounts", fs.output()[-1500:])
    bad = []

    def reader(box):
        cur = os.path.join(mnt, "mail", "." + box, "cur")
        r = random.Random(rng.random())
        end = time.time() + 6
        while time.time() < end:
            try:
                names = os.listdir(cur)
                for n in names:
                    m = re.search(r",S=(\d+):", n)
                    if not m or int(m.group(1)) not in sizes[box]:
                        bad.append(f"{box}: listed {n}, not a size of its messages")
                for n in r.sample(names, min(3, len(names))):
                    with open(os.path.join(cur, n), "rb") as f:
                        data = f.read()
                    tag = tag_of(data)
                    if tag not in boxes[box] or data != message(tag):
                        bad.append(f"{box}: read {n}: {len(data)} bytes of {tag} ({describe(data, tag)})")
            except OSError as e:
                bad.append(f"{box}: {e}")
            if len(bad) > 20:
                return

    threads = [threading.Thread(target=reader, args=(b,), daemon=True) for b in boxes]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    t.check(not bad and all(not th.is_alive() for th in threads),
            "two readers listing and reading two mailboxes at once each see only their own mailbox's "
            "names and bytes", "\n".join(bad[:10]))
    fs.stop()


def stale_name(t, dc, work):
    """A reader renames the name it looked up a moment ago (the kernel keeps it for a second)
    after another IMAP client changed the message's flags: only the reader's own change is
    applied, the other client's flag stays (DESIGN §4.4)."""
    dc.seed(".Stale", message("stale1"), info="S")
    mnt, cache = os.path.join(work, "mnt-stale"), os.path.join(work, "cache-stale")
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, cache, {"mail": dc.url()}, args=["--password-file", f"mail={dc.password_file()}"])
    if not fs.start():
        return t.check(False, "stale name: mounts", fs.output()[-1500:])
    cur = os.path.join(mnt, "mail", ".Stale", "cur")
    lost = []
    exercised, expired = 0, 0
    name = "a rename of a name another client's flag change made stale keeps that change"
    for i in range(8):
        if exercised == 3:
            break
        old = os.listdir(cur)[0]
        base = old.split(":2,")[0]
        os.stat(os.path.join(cur, old))  # the reader looks it up (mutt opens it)
        c = dc.login()
        c.select("Stale")
        c.uid("STORE", "1", "+FLAGS", "(\\Answered)")  # another client replies to it
        c.logout()
        # The mount hears of it (IDLE) while the reader's name is still in the kernel's cache.
        h.wait_for(lambda: os.path.exists(os.path.join(cur, base + ":2,RS")), 0.8, 0.02)
        renamed = False
        try:
            os.rename(os.path.join(cur, old), os.path.join(cur, base + ":2,FS"))  # the reader flags it
            exercised += 1
            renamed = True
        except FileNotFoundError:
            # The kernel's name ran out (1 s) before the rename, on a loaded machine: the lookup
            # asked ghostfs, which knows the name is stale. That is the documented ENOENT, and
            # this attempt did not test the case.
            expired += 1
        except OSError as e:
            lost.append(f"rename: {e}")
        subprocess.run([os.path.join(h.build_dir(), "fs", "ghostctl"), "--mount", mnt, "sync"],
                       capture_output=True, timeout=30)
        flags = dc.uid_flags("1", "Stale")
        if b"\\Answered" not in flags or (renamed and b"\\Flagged" not in flags):
            lost.append(f"attempt {i}: {old} -> {base}:2,FS with \\Answered set meanwhile: server has {flags}")
        c = dc.login()
        c.select("Stale")
        c.uid("STORE", "1", "FLAGS", "(\\Seen)")
        c.logout()
        h.wait_for(lambda: os.listdir(cur) == [base + ":2,S"], 5)
        time.sleep(1.1)  # the reader's names leave the kernel's cache
    print(f"# stale name: {exercised} attempts renamed the stale name, {expired} found it expired", flush=True)
    if exercised == 0 and not lost:
        t.skip(name, f"the kernel's name ran out before the rename in all {expired} attempts (loaded machine)")
    else:
        t.check(not lost, name, "\n".join(lost))
    fs.stop()


def main():
    opts = h.seeded_options(rounds=3, secs=5.0, workers=3)
    h.require_root_and_fuse()
    dc = h.started_dovecot()
    planned = 4 * opts.rounds + 3
    t = h.Tap(planned)
    work = h.tempdir()
    t0 = time.time()
    two_readers(t, dc, work, opts.seed)
    stale_name(t, dc, work)
    print(f"# the two minimal cases took {time.time() - t0:.1f} s", flush=True)
    sh = Shared()
    c = dc.login()
    for box in FOLDERS:
        if box != "INBOX":
            c.create(box)
    c.logout()
    for box, folder in FOLDERS.items():
        for i in range(6):
            tag = f"p{box}{i}"
            sh.created.add(tag)
            dc.seed(folder, message(tag), info=random.Random(tag).choice(["", "S", "FS", "R"]), into_new=i % 3 == 0)
    rng = random.Random(opts.seed)
    fs, mnt, ctl = h.mount_seeded(t, planned, work, {"mail": dc.url()}, rng, "ghostfs mounts a dovecot origin",
                                  args=["--password-file", f"mail={dc.password_file()}"])
    cache = fs.cache
    for r in range(opts.rounds):
        seed = opts.seed * 10 + r
        sh.errors.clear()
        threads = [threading.Thread(target=mount_worker, args=(w, seed, opts.secs, mnt, sh, None), daemon=True)
                   for w in range(opts.workers)]
        threads.append(threading.Thread(target=server_worker, args=(seed, opts.secs, dc, sh), daemon=True))
        threads.append(threading.Thread(target=flipper, args=(seed, opts.secs, ctl, sh), daemon=True))
        kill = rng.random() < 0.5
        sh.killed.clear()
        for th in threads:
            th.start()
        kill_after = rng.uniform(0.5, opts.secs - 0.5)  # drawn in every round, so the draws stay aligned
        print(f"# round {r}: kill={kill}" + (f" after {kill_after:.3f} s" if kill else ""), flush=True)
        if kill:  # SIGKILL in the middle of it all; the journal is replayed by the next mount
            time.sleep(kill_after)
            sh.killed.set()
            fs.kill9()
        for th in threads:
            th.join(opts.secs + 60)
        hung = [th for th in threads if th.is_alive()]
        alive = kill or fs.proc.poll() is None
        t.check(not hung and alive and not sh.errors,
                f"round {r}: concurrent Maildir and IMAP clients: no error but ENOENT/ESTALE, no hang, no crash",
                f"hung={len(hung)} alive={alive} errors={sh.errors[:10]}\n{fs.output()[-1500:]}")
        if not alive or hung:
            t.skip_rest(planned, "the daemon died or hung")
            t.done()
        if kill:
            fs = fs.again()
            if not t.check(fs.start(), f"round {r}: mounted again after a SIGKILL in the middle of the round", fs.output()[-1500:]):
                t.skip_rest(planned, "no mount")
                t.done()
        else:  # the same daemon ran the whole round: its mount is still there and answers
            try:
                answers = os.path.ismount(mnt) and bool(os.listdir(os.path.join(mnt, "mail")))
            except OSError as e:
                answers = e
            t.check(answers is True, f"round {r}: no kill this round; the daemon's mount is still there and lists mail/",
                    f"{answers}\n{fs.output()[-1500:]}")
        t0 = time.time()
        try:
            s = ghostctl(ctl, "sync", timeout=40)
        except subprocess.TimeoutExpired:
            s = subprocess.CompletedProcess([], -1, "", "ghostctl sync: no answer in 40 s")
        t1 = time.time()
        drained = h.wait_for(lambda: '"queued":0' in ghostctl(ctl, "stats").stdout.replace(" ", ""), 30)
        print(f"# round {r}: sync {t1 - t0:.1f} s (rc {s.returncode}), drained {drained} after {time.time() - t1:.1f} s",
              flush=True)
        time.sleep(1.2)  # the listings' freshness (1 s) runs out: the next listing asks the server
        mv, sv = None, None
        try:
            mv = mount_view(mnt)
            sv = server_view(dc)
            # Its own stream: the sample's draws vary with what the round left on the server, and
            # drawn from `rng` they would change the later rounds' kill decisions, so a seed
            # would replay only round 0 exactly.
            bad = compare(sh, mv, sv, random.Random(seed * 100 + 55))
        except OSError as e:
            bad = [f"listing the mount: {e}"]
        counts = dict(sorted(sh.counts.items()))
        print(f"# round {r} kill={kill} compared in {time.time() - t1:.1f} s; ops so far {counts}", flush=True)
        t.check(drained and not bad,
                f"round {r}: after sync the mount and the server hold the same messages, bytes and flags; nothing lost or duplicated",
                f"sync rc={s.returncode} {s.stdout[-300:]} {s.stderr[-300:]} drained={drained}\n" + "\n".join(bad[:25]) +
                "\nthe daemons' IMAP lines:\n" + "\n".join(imap_lines(fs.output())[-14:]) +
                f"\n{fs.output()[-2500:]}")
        fs.stop()
        probs = h.index_problems(cache)
        t.check(not probs, f"round {r}: the index passes integrity_check", probs)
        fs = fs.again()
        if not fs.start():
            t.check(False, f"round {r}: mounted again after a clean stop", fs.output()[-1500:])
            t.skip_rest(planned, "no mount")
            t.done()
    fs.stop()
    t.done()


if __name__ == "__main__":
    # meson stops the test at 180 s: before that, a hang reports where it waits
    with h.Watchdog(150, h.tracked_alive):
        main()
