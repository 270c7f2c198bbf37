#!/usr/bin/env python3
"""Fills spill to the flash log while the disk sleeps (fs/write_back.h, DESIGN §3.5 *Fills*):
ghostfs under `--profile ipaq-2004 --knob 0` with `--flash-log`, the emulated disk in standby, a
storm of fills through the shared store (the proxy's path: "store" on the control socket, the
body written to .ghost/fill/<token>) larger than the 4 MiB RAM write queue. Checks: 0 disk mode
changes while the log takes the overflow; the spilled fills are looked up with source "flash" and
read back byte-identical through .ghost/objects/, those reads charged to the flash log's device
(--flash-device, default sd-card: its energy moves, the sleeping disk does not change mode); after `ghostctl flush` (the log's flush applies
them to the store) every body is committed (a d/p version) and identical; a second storm, then
SIGKILL and a remount on the same cache and log: every fill the log had acknowledged (its lookup
said "flash") is replayed into the store, byte-identical, and the index passes sqlite's
integrity check. TAP; skipped without root or /dev/fuse."""
import json
import os
import random
import sqlite3
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 12
BODY = 256 << 10
FILLS = 28  # 7 MiB: past the 4 MiB queue cap, inside the 16 MiB log


def jctl(ctl, *args):
    exe = os.path.join(h.build_dir(), "fs", "ghostctl")
    r = subprocess.run([exe, "--control", ctl, "--json", *args], capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.stdout.strip() else {}


def disk(ctl):
    return [d for d in jctl(ctl, "stats")["devices"] if d["kind"] == "disk"][0]


def flash_device(ctl):
    """The flash log's device in the stats (--flash-device, default sd-card), or {}."""
    return next((d for d in jctl(ctl, "stats")["devices"] if d["kind"] == "flash"), {})


def storm(ctl, prefix, seed):
    """Hands FILLS bodies to the store; returns {key: body}."""
    rng = random.Random(seed)
    bodies = {}
    for i in range(FILLS):
        key = f"http://fill.test/{prefix}/{i}"
        body = rng.randbytes(BODY)
        path = ctl.ok("store", key=key, response="{}", content_type="application/octet-stream")["path"]
        with open(path, "wb") as w:
            w.write(body)
        bodies[key] = body
    return bodies


def read_lookup(ctl, key):
    """(source, version, bytes) of `key` as a lookup names it, read through the path it gives."""
    got = ctl.ok("lookup", key=key)
    if not got.get("cached"):
        return None, "", None
    path = got.get("body_path") or got["path"]
    data = got.get("packed_body")
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    else:
        data = data.encode("latin-1")
    return got.get("source"), got.get("version", ""), data


def mount(work, cache, mnt, ctl_path, flash):
    fs = h.Ghostfs(mnt, cache, {}, control=ctl_path,
                   args=["--profile", "ipaq-2004", "--knob", "0", "--flash-log", flash + ":16M"])
    return fs if fs.start() else None


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    t = h.Tap(PLAN)
    mnt = os.path.join(work, "mnt")
    cache = os.path.join(work, "cache")
    flash = os.path.join(work, "flash")
    sock = os.path.join(work, "control.sock")
    os.makedirs(mnt)
    fs = mount(work, cache, mnt, sock, flash)
    if not t.check(fs is not None, "mounts with --profile ipaq-2004 --flash-log"):
        t.skip_rest(PLAN, "not mounted")
        t.done()
    h.wait_for(lambda: disk(sock)["mode"] == "standby", 20)
    before = disk(sock)["transitions"]
    card_before = flash_device(sock)
    ctl = h.Control(sock)
    first = storm(ctl, "a", 1)
    h.wait_for(lambda: jctl(sock, "stats").get("flash_log", {}).get("fills_logged", 0) > 0, 10)
    stats = jctl(sock, "stats")
    fl = stats.get("flash_log", {})
    t.check(disk(sock)["transitions"] - before == 0 and fl.get("fills_logged", 0) >= FILLS // 2,
            f"{FILLS} fills of {BODY >> 10} KiB with the disk asleep: 0 disk mode changes, "
            f"{fl.get('fills_logged')} fills spilled to the flash log", fl)
    # The log's appends are the flash device's writes (sd-card: 10 MB/s at 0.66 W, so at least
    # 66 mJ per MB appended), counted in the log's stats and moving the device's energy.
    # The emulated card does the writes in (emulated) real time: wait until it has.
    appended = fl.get("device_bytes_written", 0)
    least_w = appended / (9766 * 1024) * 0.66
    h.wait_for(lambda: flash_device(sock).get("energy_j", 0) - card_before.get("energy_j", 0) >= least_w, 10)
    card_after = flash_device(sock)
    card_w = card_after.get("energy_j", 0) - card_before.get("energy_j", 0)
    t.check(card_before and appended >= fl.get("fills_logged", 0) * BODY > 0 and card_w >= least_w,
            f"the log's appends ({appended} bytes) charge the flash device: +{card_w:.3f} J, at least {least_w:.3f} J",
            {"flash_log": fl, "flash": [card_before, card_after]})
    card0, disk0 = flash_device(sock), disk(sock)
    seen = {k: read_lookup(ctl, k) for k in first}
    card1, disk1 = flash_device(sock), disk(sock)
    flash_keys = [k for k, (src, _v, _d) in seen.items() if src == "flash"]
    # Reading the spilled fills back is the flash device's work (its profile: 25 MB/s at 0.66 W,
    # so at least 6.9 mJ per 256 KiB read), not the sleeping disk's.
    card_j = card1.get("energy_j", 0) - card0.get("energy_j", 0)
    least = len(flash_keys) * BODY / 25e6 * 0.66
    t.check(card0 and flash_keys and card_j >= least and disk1["transitions"] == disk0["transitions"],
            f"reading {len(flash_keys)} spilled fills back charges the flash device "
            f"({card0.get('name')}: +{card_j:.3f} J, at least {least:.3f} J) and wakes no disk",
            {"flash": [card0, card1], "disk": [disk0, disk1]})
    t.check(len(flash_keys) == fl.get("fills_logged"), f"{len(flash_keys)} spilled fills are looked up with source flash",
            {k: s[0] for k, s in seen.items()})
    t.check(all(seen[k][2] == first[k] for k in first), "every fill reads back byte-identical (queue and flash log)")
    jctl(sock, "flush")
    after_flush = {k: read_lookup(ctl, k) for k in first}
    t.check(all(v[:1] in ("d", "p") and d == first[k] for k, (_s, v, d) in after_flush.items()),
            "after ghostctl flush (the log's flush) every fill is committed in the store, byte-identical",
            {k: v[1] for k, v in after_flush.items()})
    t.check(jctl(sock, "stats").get("flash_log", {}).get("records", -1) == 0, "the flash log is empty after the flush")
    # Second storm with the disk asleep again, then SIGKILL.
    h.wait_for(lambda: disk(sock)["mode"] == "standby", 30)
    second = storm(ctl, "b", 2)
    h.wait_for(lambda: sum(1 for k in second if ctl.ok("lookup", key=k).get("source") == "flash") >= FILLS // 2, 10)
    acked = [k for k in second if ctl.ok("lookup", key=k).get("source") == "flash"]
    ctl.close()
    fs.kill9()
    fs = mount(work, cache, mnt, sock, flash)
    if not t.check(fs is not None and len(acked) > 0, f"remounts after SIGKILL with {len(acked)} fills in the flash log"):
        t.skip_rest(PLAN, "not remounted")
        t.done()
    ctl = h.Control(sock)
    h.wait_for(lambda: jctl(sock, "stats").get("flash_log", {}).get("records", -1) == 0, 60)
    replayed = {k: read_lookup(ctl, k) for k in acked}
    bad = [(k, v[0], v[1], v[2] == second[k]) for k, v in replayed.items()
           if not (v[1][:1] in ("d", "p") and v[2] == second[k])]
    t.check(not bad, f"every fill the log acknowledged ({len(acked)}) is in the store after the replay, byte-identical",
            f"{bad} {jctl(sock, 'stats').get('flash_log')} {fs.output()[-3000:]}")
    # Fills that were only in RAM are absent or whole, never torn.
    others = [k for k in second if k not in acked]
    torn = [k for k in others if (r := read_lookup(ctl, k))[2] is not None and r[2] != second[k]]
    t.check(not torn, f"the {len(others)} fills only in RAM at the kill are absent or whole", torn)
    ctl.close()
    fs.stop()
    db = sqlite3.connect(os.path.join(cache, "objects-db", "index.sqlite"))
    t.check(db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", "the index passes sqlite's integrity check")
    print(f"# {FILLS} x {BODY >> 10} KiB fills, disk asleep: {fl.get('fills_logged')} spilled to the flash log, "
          f"0 spin-ups; {len(acked)} logged fills replayed after SIGKILL", flush=True)
    t.done()


if __name__ == "__main__":
    main()
