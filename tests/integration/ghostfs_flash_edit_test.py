#!/usr/bin/env python3
"""The flash log's editing goal (ghostfs --flash-log, fs/flash_local.h): under
`--profile ipaq-2004` with the emulated disk asleep, an editing workload in local/ (a few files
saved every ~2.5 s, longer than the disk's idle time before standby at --knob 0: rewritten in place with O_TRUNC + fsync, or written to a temporary file,
fsync'd and renamed over the original, as editors save) causes 0 disk spin-ups while the log has
room, the temporary file's create and its rename being metadata records in the log; without the log the same workload spins the disk up on its saves. Prints both counts and
the log's fill, and checks every saved file's content through the mount and, after unmount, on
the disk.

    ghostfs_flash_edit_test.py [SECONDS]   (default 10 per run; scripts/bench-flash-edit.sh runs 600)
TAP; skipped without root or /dev/fuse."""
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 6


def jctl(ctl, *args):
    exe = os.path.join(h.build_dir(), "fs", "ghostctl")
    r = subprocess.run([exe, "--control", ctl, "--json", *args], capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout)


def disk_dev(ctl):
    return [d for d in jctl(ctl, "devices") if d["kind"] == "disk"][0]


def disk_transitions(ctl):
    return [d for d in jctl(ctl, "stats")["devices"] if d["kind"] == "disk"][0]["transitions"]


def edit(local, seconds, seed):
    """Saves a few files with fsync every ~2.5 s for `seconds`; returns ({name: bytes}, saves, renames)."""
    rng = random.Random(seed)
    files = {}
    saves = renames = 0
    end = time.time() + seconds
    while time.time() < end:
        name = f"doc{rng.randrange(3)}.txt"
        text = files.get(name, b"") + f"line {saves}: {rng.random():.6f}\n".encode()
        if rng.random() < 0.5:
            with open(os.path.join(local, name), "wb") as f:  # O_TRUNC, rewrite, fsync
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        else:
            tmp = os.path.join(local, f".{name}.swp")
            with open(tmp, "wb") as f:  # write a copy, fsync it, rename it over the original
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, os.path.join(local, name))
            renames += 1
        files[name] = text
        saves += 1
        time.sleep(rng.uniform(2.0, 3.0))
    return files, saves, renames


def run(work, seconds, flash_args, t, label):
    mnt = os.path.join(work, f"mnt-{label}")
    cache = os.path.join(work, f"cache-{label}")
    ctl = os.path.join(work, f"{label}.sock")
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=["--profile", "ipaq-2004", "--knob", "0", *flash_args])
    if not fs.start():
        return None
    h.wait_for(lambda: disk_dev(ctl)["mode"] == "standby", 15)
    before = disk_transitions(ctl)
    files, saves, renames = edit(os.path.join(mnt, "local"), seconds, 7)
    after = disk_transitions(ctl)
    stats = jctl(ctl, "stats")
    seen = {}
    for name in files:
        with open(os.path.join(mnt, "local", name), "rb") as f:
            seen[name] = f.read()
    fs.stop()
    on_disk = {}
    for name in files:
        with open(os.path.join(cache, "local", name), "rb") as f:
            on_disk[name] = f.read()
    return {"spin_transitions": after - before, "saves": saves, "renames": renames, "files": files, "seen": seen,
            "on_disk": on_disk, "flash": stats.get("flash_log"), "stop_seconds": fs.stop_seconds,
            "stop_killed": fs.stop_killed, "log": fs.log}


def differences(run):
    """What a failed content check prints: how the daemon ended, each file that differs (its
    lengths, where it starts to differ), then the tail of the daemon's log."""
    out = [f"unmount to exit {run['stop_seconds']:.1f} s, killed: {run['stop_killed']}"]
    for name, want in run["files"].items():
        got = run["on_disk"].get(name)
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got or b"", want)) if a != b), min(len(got or b""), len(want)))
            out.append(f"{name}: want {len(want)} bytes, got {None if got is None else len(got)}, first difference "
                       f"at {at}: want {want[at:at + 40]!r} got {None if got is None else got[at:at + 40]!r}")
    try:
        with open(run["log"], errors="replace") as f:
            out += ["log: " + line for line in f.read().splitlines()[-25:]]
    except OSError:
        pass
    return "\n".join(out)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else float(os.environ.get("GHOST_FLASH_EDIT_SECONDS", "10"))
    h.require_root_and_fuse()
    work = h.tempdir()
    t = h.Tap(PLAN)
    with_log = run(work, seconds, ["--flash-log", os.path.join(work, "flash") + ":4M"], t, "flash")
    if not t.check(with_log is not None, "mounts with --profile ipaq-2004 --flash-log"):
        t.skip_rest(PLAN - 1, "not mounted")
        t.done()
    t.check(with_log["saves"] >= 3 and with_log["spin_transitions"] == 0,
            f"{with_log['saves']} fsync'd saves with the flash log: 0 disk mode changes", with_log)
    t.check(with_log["seen"] == with_log["files"], "every save reads back through the mount")
    t.check(with_log["on_disk"] == with_log["files"], "after unmount every save is on the disk",
            differences(with_log))
    without = run(work, seconds, [], t, "plain")
    t.check(without is not None and without["spin_transitions"] > 0,
            f"without the log the same saves change the disk's mode {without and without['spin_transitions']} times",
            without and without["saves"])
    fl = with_log["flash"] or {}
    t.check(fl.get("flushes", {}).get("full", 1) == 0 and fl.get("appends", 0) >= with_log["saves"]
            and fl.get("meta_logged", 0) >= with_log["renames"] > 0,
            f"the log took every save and was never full; the {with_log['renames']} save-by-rename creates and "
            f"renames are metadata records in it", fl)
    print(f"# editing {seconds:.0f} s, ipaq-2004: {with_log['saves']} saves with the flash log -> "
          f"{with_log['spin_transitions']} disk mode changes (log {fl.get('used')} of {fl.get('capacity')} bytes, "
          f"{fl.get('appends')} appends); without it {without and without['saves']} saves -> "
          f"{without and without['spin_transitions']} disk mode changes; unmount to exit {with_log['stop_seconds']:.1f} s "
          f"with the log", flush=True)
    t.done()


if __name__ == "__main__":
    main()
