#!/usr/bin/env python3
"""The live experiment, CI-sized (DESIGN §7.2): scripts/replay replays the first REPLAY_PREFIX
seconds (default 75) of the shipped web and mail traces live — ghostfs with the ipaq-2004
emulated devices, ghostproxy, nginx and dovecot behind the link emulator; the mail trace twice,
through the Maildir view and through ghostproxy's IMAP proxy (--via imap-proxy) — with adaptive
K=50 and with static, runs ghostsim on exactly the same requests, and checks live against simulated
(±15% on mean response time and on energy; both figures and the ratio are printed) and
adaptive against static live. TAP; skips when the machine cannot run the link emulator or
lacks root, /dev/fuse, nginx or dovecot."""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = float(os.environ.get("REPLAY_PREFIX", "75"))
TOLERANCE = 0.15
PLAN = 26
# name -> (trace, extra replay options)
KINDS = {"web": ("web", []), "mail": ("mail", []), "mail via imap-proxy": ("mail", ["--via", "imap-proxy"])}


def replay(trace, policy, out_trace, extra=()):
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "replay"), "--trace", trace, "--profile", "ipaq-2004",
           "--policy", policy, "--knob", "50", "--prefix", str(PREFIX), "--write-trace", out_trace,
           "--build", h.build_dir(), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    return r


def ghostsim(trace, policy):
    exe = os.path.join(h.build_dir(), "fs", "ghostsim")
    r = subprocess.run([exe, "--profile", "ipaq-2004", "--policy", policy, "--knob", "50", trace],
                       capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout)


def workdir_of(pid):
    """The work directory of the replay with this pid (its ghostfs child's --cache is in it), or
    None: the checks below look at this replay's mounts and daemons only, not at those of other
    replays running on the machine (a broad pkill killed them)."""
    r = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    for child in r.stdout.split():
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "--cache" in args[:-1]:
            return os.path.dirname(args[args.index("--cache") + 1])
    return None


def replay_mounts(workdir, before):
    """Mounts of that replay (under its work directory), or, when it is unknown, replay mounts
    that were not there before it started."""
    with open("/proc/mounts") as f:
        lines = [l for l in f if "ghost-replay-" in l]
    return [l for l in lines if workdir in l] if workdir else [l for l in lines if l not in before]


def within(live, sim):
    return sim > 0 and abs(live / sim - 1) <= TOLERANCE


def main():
    h.require_root_and_fuse()
    linkemu = os.path.join(ROOT, "scripts", "linkemu.sh")
    env = dict(os.environ, NFQ_DELAY=os.path.join(h.build_dir(), "tests", "linkemu", "nfq_delay"))
    chk = subprocess.run([linkemu, "check", "--name", "rplay"], capture_output=True, text=True, env=env)
    if chk.returncode != 0:
        h.skip_all(f"the link emulator cannot run here: {chk.stderr.strip()}")
    for tool in ("/usr/sbin/nginx", "/usr/sbin/dovecot"):
        if not os.path.exists(tool):
            h.skip_all(f"{tool} is missing")
    t = h.Tap(PLAN)
    work = h.tempdir("ghost-replay-test-")
    results = {}
    for kind, (name, extra) in KINDS.items():
        trace = os.path.join(ROOT, "common", "traces", f"{name}.trace")
        for policy in ("adaptive", "static"):
            prefix_trace = os.path.join(work, f"{kind.replace(' ', '-')}-{policy}.trace")
            requests_csv = os.path.join(work, f"{kind.replace(' ', '-')}-{policy}.csv")
            run_extra = list(extra) + ["--requests", requests_csv]
            timeline = kind == "mail via imap-proxy" and policy == "adaptive" and shutil.which("tcpdump")
            if timeline:
                run_extra.append("--send-timeline")
            # A timing experiment beside a loaded machine (CI runs it beside the build and the
            # other tests): one run in about five came out 15-17% slow on mean response time, a
            # stall or two of the whole machine among its few requests. A run outside ±15% is
            # run once more and both are printed; the checks judge the second. A real change of
            # fidelity misses in both.
            for attempt in (1, 2):
                r = replay(trace, policy, prefix_trace, run_extra)
                live = None
                try:
                    live = json.loads(r.stdout)
                except ValueError:
                    pass
                ok = r.returncode == 0 and live is not None and live.get("mode") == "live"
                if not ok:
                    break
                sim = ghostsim(prefix_trace, policy)
                if attempt == 2 or (within(live["mean_response_ms"], sim["mean_response_ms"])
                                    and within(live["energy_j"], sim["energy_j"])):
                    break
                print(f"# {kind} {policy}: first run outside ±15% (mean response live {live['mean_response_ms']:.1f} ms, "
                      f"sim {sim['mean_response_ms']:.1f} ms, ratio {live['mean_response_ms'] / sim['mean_response_ms']:.3f}; "
                      f"energy ratio {live['energy_j'] / sim['energy_j']:.3f}; load {os.getloadavg()[0]:.1f}): "
                      f"running it once more", flush=True)
            t.check(ok, f"{kind} {policy}: the first {PREFIX:g} s replay live", r.stderr[-2000:])
            if not ok:
                for _ in range(2 if kind == "mail via imap-proxy" else 1):  # as many checks as a run makes
                    t.check(False, f"{kind} {policy}: live within ±15% of ghostsim", "no live run")
                if kind == "mail via imap-proxy" and policy == "adaptive":
                    t.check(False, f"{kind} {policy}: the first request starts on time", "no live run")
                    t.check(False, f"{kind} {policy}: --send-timeline finds the SEND's APPEND exchange", "no live run")
                continue
            results[(kind, policy)] = live
            rt, en = live["mean_response_ms"], live["energy_j"]
            print(f"# {kind} {policy}: mean response live {rt:.1f} ms, sim {sim['mean_response_ms']:.1f} ms "
                  f"(ratio {rt / sim['mean_response_ms']:.3f}); energy live {en:.2f} J, sim {sim['energy_j']:.2f} J "
                  f"(ratio {en / sim['energy_j']:.3f}); sources live {live['sources']} sim {sim['sources']}",
                  flush=True)
            figures = json.dumps({"live": {k: live[k] for k in ("mean_response_ms", "energy_j", "duration_s", "sources")},
                                  "sim": {k: sim[k] for k in ("mean_response_ms", "energy_j", "duration_s", "sources")}})
            if kind == "mail via imap-proxy" and policy == "adaptive":
                # The client logs in before time 0 (through the pre-fill's daemon), so the first
                # request starts at its trace time, not after a login over the link (1.2-1.4 s
                # late before, past the static disk's 0.5 s low-power timeout).
                with open(requests_csv) as f:
                    starts = [float(l.split(",")[0]) for l in f.read().splitlines()[1:]]
                t.check(bool(starts) and 0 <= starts[0] < 0.5,
                        f"{kind} {policy}: the first request starts on time (within 0.5 s of time 0)",
                        starts[:3])
                rows = live.get("send_timeline")
                if not timeline:
                    t.n += 1
                    print(f"ok {t.n} - {kind} {policy}: --send-timeline finds the SEND's APPEND exchange "
                          f"# SKIP tcpdump is missing", flush=True)
                else:
                    # One SEND in the prefix: its APPEND on the link, with the "+" continuation a
                    # real round trip (40 ms) and the tagged answer after the literal.
                    x = rows[0] if rows else {}
                    t.check(len(rows or []) == 1 and (x.get("continuation_round_trip_ms") or 0) >= 35
                            and (x.get("real_exchange_ms") or 0) > x.get("continuation_round_trip_ms", 0)
                            and (x.get("server_answer") or "").split(" ")[1:2] == ["OK"],
                            f"{kind} {policy}: --send-timeline finds the SEND's APPEND exchange", rows)
            if kind == "mail via imap-proxy":
                # Time and energy, each enforced (issue 14 Deliver 6). Time was a known shortfall
                # (1.075-1.16) until the replay logged the client in before time 0, read time 0
                # to the millisecond and stopped timing its own work (scripts/RESULTS.md).
                t.check(within(en, sim["energy_j"]), f"{kind} {policy}: live within ±15% of ghostsim on energy",
                        figures)
                t.check(within(rt, sim["mean_response_ms"]),
                        f"{kind} {policy}: live within ±15% of ghostsim on mean response time "
                        f"(ratio {rt / sim['mean_response_ms']:.3f})", figures)
                continue
            t.check(within(rt, sim["mean_response_ms"]) and within(en, sim["energy_j"]),
                    f"{kind} {policy}: live within ±15% of ghostsim on mean response time and energy", figures)
    imap = results.get(("mail via imap-proxy", "adaptive"))
    t.check(imap is not None and imap.get("via") == "imap-proxy" and imap["client_sources"].get("cache", 0) > 0
            and imap["client_sources"].get("server", 0) > 0,
            "mail via imap-proxy: the IMAP client got bodies from the cache and from the server",
            imap and imap.get("client_sources"))
    for kind in KINDS:
        a, s = results.get((kind, "adaptive")), results.get((kind, "static"))
        if not a or not s:
            t.check(False, f"{kind}: adaptive beats static on response time live", "a run failed")
            t.check(False, f"{kind}: adaptive uses no more energy than static live", "a run failed")
            continue
        print(f"# {kind}: adaptive {a['mean_response_ms']:.1f} ms {a['energy_j']:.2f} J; "
              f"static {s['mean_response_ms']:.1f} ms {s['energy_j']:.2f} J", flush=True)
        t.check(a["mean_response_ms"] < s["mean_response_ms"], f"{kind}: adaptive beats static on response time live",
                (a["mean_response_ms"], s["mean_response_ms"]))
        # Over a prefix this short, energy is mostly base power over the same duration: the
        # check is that adaptive does not cost more (within 1%), not the paper's full-trace saving.
        t.check(a["energy_j"] <= s["energy_j"] * 1.01, f"{kind}: adaptive uses no more energy than static live (1%)",
                (a["energy_j"], s["energy_j"]))
    # Interrupting a replay cleans everything up (namespaces, mounts, processes).
    before = replay_mounts(None, [])
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "replay"), "--trace",
                          os.path.join(ROOT, "common", "traces", "web.trace"), "--prefix", "30",
                          "--build", h.build_dir()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    started = False
    while time.time() < deadline and p.poll() is None:
        if subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count("rplay") >= 2:
            started = True
            time.sleep(4)
            break
        time.sleep(0.2)
    wd = workdir_of(p.pid)
    p.send_signal(2)
    try:
        _, err = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    left_ns = "rplay" in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left_mounts = replay_mounts(wd, before)
    t.check(started and p.returncode == 130 and not left_ns and not left_mounts,
            "Ctrl-C during a replay removes its namespaces, mounts and processes",
            (started, p.returncode, left_ns, left_mounts, err[-600:]))

    # A daemon that dies mid-run: the run stops at once, says which and why, and cleans up.
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "replay"), "--trace",
                          os.path.join(ROOT, "common", "traces", "web.trace"), "--prefix", "60",
                          "--build", h.build_dir()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = False
    wd = None
    deadline = time.time() + 90
    while time.time() < deadline and p.poll() is None and not killed:
        wd = wd or workdir_of(p.pid)
        if wd and replay_mounts(wd, []):
            # this run's ghostfs (after the pre-fill's, which has no --profile): a child of
            # this replay only
            killed = subprocess.run(["pkill", "-9", "-P", str(p.pid), "-f",
                                     "ghostfs .*--profile"]).returncode == 0
        time.sleep(0.2)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    left_ns = "rplay" in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left_mounts = replay_mounts(wd, before)
    t.check(killed and p.returncode == 1 and "ghostfs exited (status -9)" in err
            and not left_ns and not left_mounts,
            "ghostfs killed mid-run: the replay stops with a message naming it and cleans up",
            (killed, p.returncode, left_ns, left_mounts, err[-800:]))

    # A trace the origin cannot serve is refused before anything starts.
    bad = os.path.join(work, "bad.trace")
    with open(bad, "w") as f:
        f.write("# ghost-trace web v1\n0.0 GET http://origin.test/a/../../etc/passwd 100 0\n")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "replay"), "--trace", bad,
                        "--build", h.build_dir()], capture_output=True, text=True, timeout=60)
    t.check(r.returncode == 2 and "bad.trace:2" in r.stderr and "cannot be a file on the origin" in r.stderr,
            "a trace naming an object the origin cannot serve gets a clear message (file:line)",
            (r.returncode, r.stderr[-400:]))
    t.done()


if __name__ == "__main__":
    main()
