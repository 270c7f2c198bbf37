#!/usr/bin/env python3
"""ghostfs --devices auto on this machine and over a fake sysfs: `ghostctl devices` says plainly
which real devices back the model and why each one is modelled only (here: the route to the
127.0.0.1 origin is over loopback, not Wi-Fi; the cache's disk is not driven unless named); with
GHOST_SYSFS_ROOT pointing at a tree with a battery, `ghostctl stats` shows the measured power
beside the model's; bad --devices / --manage-disk are refused; SIGTERM ends it cleanly.
TAP; skipped without root, /dev/fuse or nginx."""
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402
from harness import wait_for  # noqa: E402

PLAN = 14


def fake_sysfs(root):
    bat = os.path.join(root, "class", "power_supply", "BAT0")
    os.makedirs(bat)
    for name, value in {"type": "Battery", "status": "Discharging", "power_now": "9500000",
                        "energy_now": "40000000"}.items():
        with open(os.path.join(bat, name), "w") as f:
            f.write(value + "\n")


def main():
    work, root, sums, nginx = h.serve_tree()
    t = h.Tap(PLAN)
    exe = os.path.join(h.build_dir(), "fs", "ghostfs")

    # Refused before mounting (exit 2, one line each).
    r = subprocess.run([exe, "--cache", os.path.join(work, "c0"), "--devices", "maybe",
                        os.path.join(work, "m0")], capture_output=True, text=True, timeout=30)
    t.check(r.returncode == 2 and "--devices \"maybe\" is neither" in r.stderr,
            "--devices other than auto|none is refused", r.stderr)
    r = subprocess.run([exe, "--cache", os.path.join(work, "c0"), "--manage-disk", "/dev/sda",
                        os.path.join(work, "m0")], capture_output=True, text=True, timeout=30)
    t.check(r.returncode == 2 and "--manage-disk needs --devices auto" in r.stderr,
            "--manage-disk without --devices auto is refused", r.stderr)

    # This machine's own devices.
    fs, _, ctl = h.mount_origin(t, PLAN, work, nginx.url(), args=["--devices", "auto"],
                                check="mounts with --devices auto")
    devs = h.ghostctl_json(ctl, "devices")
    t.check([d["name"] for d in devs] == ["laptop-hdd", "wifi-ac"],
            "without --profile the model is laptop-2024's disk and card", devs)
    net = devs[1].get("hardware", {})
    t.check(net.get("link") == "loopback" and net.get("interface") == "lo" and not net.get("managed"),
            "the route to the 127.0.0.1 origin is found over lo, modelled only", net)
    disk = devs[0].get("hardware", {})
    t.check("managed" in disk and not disk["managed"], "the cache's disk is not driven unless named", disk)
    text = h.ghostctl(ctl, "devices").stdout
    t.check("REAL DEVICE" in text and "wifi-ac: the route to 127.0.0.1 is over lo (loopback), not Wi-Fi" in text,
            "ghostctl devices says plainly that the card is not Wi-Fi", text)
    t.check(("laptop-hdd: " in text) and ("modelled only" in text or "reported only" in text),
            "ghostctl devices says why the disk is only modelled or reported", text)
    stats = h.ghostctl_json(ctl, "stats")
    has_meter = os.path.isdir("/sys/class/powercap") or any(
        n.startswith("BAT") for n in os.listdir("/sys/class/power_supply"))
    if has_meter:
        t.check("measured" in stats, "stats has a measured section (this machine has a meter)", stats)
    else:
        t.check(stats.get("measured", {}).get("meters") == [] and
                any("no energy meter" in n for n in stats["measured"]["notes"]),
                "stats says there is no energy meter on this machine", stats.get("measured"))
    out = fs.output()
    t.check("ghostfs: network: the route to 127.0.0.1 is over lo" in out,
            "the limitation is logged once at start", out)
    # SIGTERM: a clean exit (the card's setting would be restored here).
    fs.proc.send_signal(signal.SIGTERM)
    t.check(wait_for(lambda: fs.proc.poll() is not None, 10) and fs.proc.returncode == 0,
            "SIGTERM ends ghostfs --devices auto cleanly", fs.output())
    fs.stop()

    # A fake sysfs with a battery: the meter appears beside the model's power.
    sysroot = os.path.join(work, "sysfs")
    fake_sysfs(sysroot)
    mnt2 = os.path.join(work, "mnt2")
    os.makedirs(mnt2)
    ctl2 = os.path.join(work, "control2.sock")
    os.environ["GHOST_SYSFS_ROOT"] = sysroot
    fs2 = h.Ghostfs(mnt2, os.path.join(work, "cache2"), {"www": nginx.url()},
                    args=["--devices", "auto", "--profile", "laptop-2024"], control=ctl2)
    started = fs2.start()
    del os.environ["GHOST_SYSFS_ROOT"]
    if not t.check(started, "mounts with GHOST_SYSFS_ROOT set", fs2.output()):
        t.skip_rest(PLAN, "not mounted")
        t.done()
    m = h.ghostctl_json(ctl2, "stats").get("measured", {})
    meters = m.get("meters", [])
    t.check(len(meters) == 1 and meters[0]["name"] == "BAT0" and abs(meters[0]["power_w"] - 9.5) < 1e-9
            and abs(m.get("power_w", 0) - 9.5) < 1e-9,
            "the fake battery is the measured power", m)
    text = h.ghostctl(ctl2, "stats").stdout
    t.check("measured 9.50 W" in text and "model " in text and "(BAT0)" in text,
            "ghostctl stats shows measured power beside the model's", text)
    fs2.stop()
    t.done()


if __name__ == "__main__":
    main()
