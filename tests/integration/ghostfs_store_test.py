#!/usr/bin/env python3
"""The shared store ghostproxy uses (fs/store_tree.cc, common/control/control.h): lookup / store /
refresh / invalidate over the control socket, bodies through MOUNTPOINT/.ghost/, fills through
the deferred write queue (a sleeping disk stays asleep, reads see the queued copy), the cost
model's choice with ghost hints, the "objects" topic (changes pushed to clients that keep
copies in RAM) and the "served" op (their memory reads counted), persistence across a remount, and bad requests. TAP; skipped
without root, /dev/fuse or nginx."""
import base64
import errno
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402
from harness import wait_for  # noqa: E402

PLAN = 26


def store(ctl, key, body, **fields):
    path = ctl.ok("store", key=key, **fields)["path"]
    with open(path, "wb") as w:
        w.write(body)
    return path


def errno_of(fn):
    try:
        fn()
    except OSError as e:
        return e.errno
    return 0


def disk_mode(ctl):
    return [d for d in ctl.ok("devices") if d["kind"] == "disk"][0]["mode"]


def main():
    work, root, sums, nginx = h.serve_tree()
    t = h.Tap(PLAN)
    fs, mnt, sock = h.mount_origin(t, PLAN, work, nginx.url(), args=["--profile", "ipaq-2004"],
                                   check="mounts with a control socket")
    ctl = h.Control(sock)

    t.check(ctl.ok("lookup", key="http://example.test/a") == {"cached": False}, "an unknown key is not cached")

    body = os.urandom(300_000)
    head = json.dumps({"status": 200, "headers": [["Content-Type", "application/octet-stream"]]})
    store(ctl, "http://example.test/a", body, response=head, etag='"v1"', expires_unix=int(time.time()) + 3600)
    store(ctl, "http://example.test/small", b"s" * 20_000, response="{}")
    got = ctl.ok("lookup", key="http://example.test/a")
    with open(got["path"], "rb") as f:
        read = f.read()
    with open(got.get("body_path", "/nonexistent"), "rb") as f:
        direct = f.read()
    t.check(got["cached"] and got["size"] == len(body) and got["response"] == head and read == body
            and direct == body,
            "a stored body reads back byte-identical through .ghost/objects (and from body_path), with its stored head",
            {k: v for k, v in got.items() if k != "response"})

    t.check(".ghost" not in os.listdir(mnt) and sorted(os.listdir(os.path.join(mnt, ".ghost"))) == ["fill", "objects"],
            ".ghost/ is not listed in the root and holds fill/ and objects/", os.listdir(mnt))
    objects = os.path.join(mnt, ".ghost", "objects")
    bad = {
        "unknown object": errno_of(lambda: open(os.path.join(objects, "0" * 64), "rb")),
        "object opened for writing": errno_of(lambda: open(got["path"], "r+b")),
        "create in objects/": errno_of(lambda: open(os.path.join(objects, "new"), "wb")),
        "unlink an object": errno_of(lambda: os.unlink(got["path"])),
    }
    t.check(bad == {"unknown object": errno.ENOENT, "object opened for writing": errno.EACCES,
                    "create in objects/": errno.EROFS, "unlink an object": errno.EROFS},
            "objects are read-only and reached only by the names lookup hands out", bad)

    # An object on the disk, replaced below by a fill of another size while the disk sleeps.
    pair_key = "http://example.test/pair"
    pair_old = b"<old>" * 40_000
    store(ctl, pair_key, pair_old, response='{"v":"old"}')

    # The disk sleeps: a fill waits in the write queue, a lookup reads it from memory.
    t.check(wait_for(lambda: disk_mode(ctl) == "standby", 15), "the idle disk reaches standby")
    small = b"queued body\n" * 100
    store(ctl, "http://example.test/b", small, response="{}")
    got = ctl.ok("lookup", key="http://example.test/b")
    with open(got["path"], "rb") as f:
        read = f.read()
    queued = ctl.ok("stats")["write_queue"]["queued_bytes"]
    t.check(got["source"] == "memory" and read == small and queued >= len(small) and disk_mode(ctl) == "standby"
            and got["version"].startswith("q") and base64.b64decode(got.get("body_base64", "")) == small,
            "a fill made while the disk sleeps is queued and read from memory (its small body in the lookup's "
            "answer); the disk stays in standby",
            (got["source"], queued, disk_mode(ctl)))
    # The same for a small body sent inline in the "store" request: queued, not written.
    inline_body = b"inline while asleep\n" * 40
    before_q = ctl.ok("stats")["write_queue"]["queued_bytes"]
    ctl.ok("store", key="http://example.test/inline", response="{}",
           body_base64=base64.b64encode(inline_body).decode())
    got = ctl.ok("lookup", key="http://example.test/inline")
    with open(got["path"], "rb") as f:
        read = f.read()
    t.check(got["version"].startswith("q") and read == inline_body
            and base64.b64decode(got.get("body_base64", "")) == inline_body
            and ctl.ok("stats")["write_queue"]["queued_bytes"] >= before_q + len(inline_body)
            and disk_mode(ctl) == "standby",
            "an inline fill made while the disk sleeps waits in the write queue like a fill file's; the disk "
            "stays in standby", (got.get("version"), disk_mode(ctl)))

    # A committed body and a queued replacement of another size: the lookup describes one
    # version (its size, head and path all the queued one's), never the disk's size and head
    # with the queued bytes (a reader then cut the longer body to the shorter size).
    on_disk = ctl.ok("lookup", key=pair_key)
    pair_new = b"<new>" * 30_000
    store(ctl, pair_key, pair_new, response='{"v":"new"}')
    got = ctl.ok("lookup", key=pair_key)
    with open(got["path"], "rb") as f:
        read = f.read()
    stat_size = os.stat(got["path"]).st_size
    t.check(on_disk.get("version", "").startswith("d") and got["version"].startswith("q")
            and got["size"] == len(pair_new) == len(read) == stat_size and read == pair_new
            and got["response"] == '{"v":"new"}' and disk_mode(ctl) == "standby",
            "a lookup of a cached object with a fill queued answers the queued version's size, head and bytes",
            (on_disk.get("version"), got.get("version"), got.get("size"), len(read), stat_size, read[:5],
             got.get("response"), got.get("body_path")))

    # Knob 100 (performance): a small cached object on a sleeping disk comes from the network
    # (no spin-up to wait for), and the disk hears a ghost hint (its ideal mode would have won).
    ctl.ok("knob", value=100)
    # "small" was read a moment ago, so the page-cache model holds it (memory wins); forget it.
    dropped = ctl.ok("drop_caches")["dropped"]
    hints_before = ctl.ok("stats")["ghost_hints_sent"]
    got = ctl.ok("lookup", key="http://example.test/small")
    stats = ctl.ok("stats")
    t.check(dropped >= 1 and got["choice"] == "network" and got["ghost_hint"]
            and stats["ghost_hints_sent"] == hints_before + 1 and stats["proxy"]["network_preferred"] == 1,
            "at K=100 with the disk in standby (and drop_caches) the network wins and the disk gets a ghost hint",
            (dropped, got["choice"], got["ghost_hint"], got.get("cost"), stats["proxy"]))
    ctl.ok("knob", value=50)

    ctl.ok("refresh", key="http://example.test/a", response='{"status":200,"refreshed":true}', etag='"v2"')
    got = ctl.ok("lookup", key="http://example.test/a")
    t.check(got["response"] == '{"status":200,"refreshed":true}' and got["size"] == len(body),
            "refresh replaces the stored head and keeps the body", got["response"])
    r = ctl.call("refresh", key="http://example.test/none", response="{}")
    t.check(not r["ok"] and "not in the cache" in r["error"], "refresh of an uncached key is an error", r)

    store(ctl, "http://example.test/c", b"old", response="{}")
    store(ctl, "http://example.test/c", b"new body", response='{"v":2}')
    got = ctl.ok("lookup", key="http://example.test/c")
    with open(got["path"], "rb") as f:
        read = f.read()
    t.check(read == b"new body" and got["response"] == '{"v":2}', "a second store replaces the object", read)

    gone = ctl.ok("invalidate", key="http://example.test/c")
    t.check(gone == {"removed": True} and ctl.ok("lookup", key="http://example.test/c") == {"cached": False}
            and ctl.ok("invalidate", key="http://example.test/c") == {"removed": False},
            "invalidate drops a key (and says so)", gone)

    # The "objects" topic, a RAM copy's invalidation feed: a refresh (of a committed object)
    # and an invalidation (of a fill still queued) are each pushed once, in order.
    sub = h.Control(sock)
    sub.ok("subscribe", topics=["objects"])
    ctl.ok("refresh", key="http://example.test/a", response='{"status":200,"refreshed":true}')
    store(ctl, "http://example.test/f", b"f body", response="{}")
    ctl.ok("invalidate", key="http://example.test/f")
    sub.sock.settimeout(5)
    events = []
    try:
        for _ in range(2):
            events.append(json.loads(sub.f.readline()))
    except (OSError, ValueError) as e:  # an event that never comes
        events.append(repr(e))
    events = [e if isinstance(e, dict) else {"error": e} for e in events]
    t.check([(e.get("event"), e.get("data", {}).get("key")) for e in events]
            == [("objects", "http://example.test/a"), ("objects", "http://example.test/f")],
            "refreshed and invalidated objects are pushed to subscribers of \"objects\"", events)
    sub.close()

    # "served": reads a client answered from its RAM copy count as memory reads.
    before = ctl.ok("stats")
    ctl.ok("served", memory={"http://example.test/a": 3, "http://example.test/gone": 1}, bytes=100)
    bad = [ctl.call("served", memory={"k": 0}), ctl.call("served", memory=[]), ctl.call("served")]
    after = ctl.ok("stats")
    t.check(after["requests"]["memory"] - before["requests"]["memory"] == 4
            and after["proxy"]["memory_hits"] - before["proxy"]["memory_hits"] == 4
            and all(not r["ok"] and "memory" in r["error"] for r in bad),
            "served counts memory reads; malformed reports get error replies",
            (before["requests"], after["requests"], bad))

    replies = {
        "no key": ctl.call("lookup"),
        "empty key": ctl.call("store", key=""),
        "bad expires": ctl.call("store", key="k", expires_unix="soon"),
        "bad response": ctl.call("refresh", key="k", response=7),
    }
    t.check(all(not r["ok"] and r["error"] for r in replies.values()),
            "malformed store requests get error replies", replies)
    t.check(ctl.ok("lookup", key="http://example.test/a")["cached"], "the daemon answers after bad requests")

    path = ctl.ok("store", key="http://example.test/d")["path"]
    t.check(errno_of(lambda: open(path, "rb")) == errno.EACCES, "a fill cannot be opened for reading")

    path = ctl.ok("store", key="http://example.test/e", response="{}")["path"]
    with open(path, "wb") as w:
        w.write(b"half a body")
        w.flush()
        os.unlink(path)
    t.check(ctl.ok("lookup", key="http://example.test/e") == {"cached": False}
            and ctl.ok("stats")["proxy"]["open_fills"] == 1,  # only d's, never written
            "unlinking a fill before closing it abandons the fill", ctl.ok("stats")["proxy"])

    # The fetch's transfer folded into the miss's lookup and the inline store (one round trip
    # each instead of three): the lookup begins it, the store ends it, after its data.
    miss = ctl.ok("lookup", key="http://example.test/folded", begin_transfer=True)
    open_now = ctl.ok("stats")["proxy"]["open_transfers"]
    hit = ctl.ok("lookup", key="http://example.test/a", begin_transfer=True)
    t.check(miss.get("cached") is False and isinstance(miss.get("transfer"), int) and miss.get("card") is True
            and open_now == 1 and "transfer" not in hit,
            "a miss looked up with begin_transfer begins the fetch's transfer (a hit begins none)", (miss, open_now))
    stored = ctl.call("store", key="http://example.test/folded", response="{}",
                      body_base64=base64.b64encode(b"folded").decode(), transfer_end=miss["transfer"],
                      transfer_bytes=6)
    closed = wait_for(lambda: ctl.ok("stats")["proxy"]["open_transfers"] == 0, 10)
    again = ctl.call("transfer", phase="end", transfer=miss["transfer"])
    unknown = ctl.call("store", key="http://example.test/folded2", response="{}",
                       body_base64=base64.b64encode(b"x").decode(), transfer_end=987654)
    t.check(stored.get("ok") and stored["result"] == {"stored": 6} and closed
            and not again["ok"] and "no open transfer" in again["error"]
            and not unknown["ok"] and "stored, but no open transfer 987654" in unknown["error"],
            "an inline store with transfer_end ends that transfer once the card has carried its bytes",
            (stored, again, unknown))

    # A client that goes without ending its transfers (a proxy killed, or stopped, mid-send) has
    # them ended when its connection closes: an open one is activity to the card's power policy,
    # which then starts no new run and arms no idle timer (ghostproxy_smtp check 14, round 18).
    # Another connection's transfer stays open.
    mine = ctl.ok("transfer", phase="begin")["transfer"]
    gone = h.Control(sock)
    gone.ok("transfer", phase="begin")
    gone.ok("lookup", key="http://example.test/orphan", begin_transfer=True)
    open_before = ctl.ok("stats")["proxy"]["open_transfers"]
    gone.close()
    orphaned = wait_for(lambda: ctl.ok("stats")["proxy"]["open_transfers"] == 1, 10)
    proxy_stats = ctl.ok("stats")["proxy"]
    ended = ctl.call("transfer", phase="end", transfer=mine)
    t.check(open_before == 3 and orphaned and proxy_stats.get("orphaned_transfers") == 2 and ended["ok"]
            and ctl.ok("stats")["proxy"]["open_transfers"] == 0,
            "a closed connection's open transfers end with it; another's stays open until its end",
            (open_before, proxy_stats, ended))

    ctl.ok("flush")
    ctl.close()
    fs.stop()
    t.check(fs.start(), "remounts", fs.output())
    ctl = h.Control(sock)
    got = ctl.ok("lookup", key="http://example.test/a")
    with open(got["path"], "rb") as f:
        read = f.read()
    t.check(read == body and got["response"] == '{"status":200,"refreshed":true}',
            "stored objects and their refreshed heads survive a remount", got.get("response"))
    got = ctl.ok("lookup", key="http://example.test/b")
    t.check(got["cached"] and got["source"] == "disk", "the fill that was queued is on the disk now", got)
    ctl.close()
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
