#!/usr/bin/env bash
# The main job: installs what is missing, builds, and demonstrates Ghost on its defaults.
#  1. starts a local origin (nginx on 127.0.0.1, a generated site), mounts ghostfs on it with
#     the paper's emulated devices (ipaq-2004), reads through the mount twice, shows the
#     decisions (extended attributes) and `ghostctl devices` / `ghostctl stats`, and
#     unmounts cleanly;
#     starts ghostproxy on the same cache and fetches a page with its images through it (wget
#     -p, twice), showing each decision in the access log and the proxy's status page;
#  2. prints the simulator comparison of DESIGN §7 on the shipped traces.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ghost_install
ghost_build

work=$(mktemp -d /tmp/ghost-demo.XXXXXX)
mnt=$work/mnt
ctl=$work/control.sock
nginx_pid=""
cleanup() {
  if mountpoint -q "$mnt" 2>/dev/null; then fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true; fi
  [ -n "${proxy_pid:-}" ] && kill "$proxy_pid" 2>/dev/null || true
  [ -n "${ghostfs_pid:-}" ] && kill "$ghostfs_pid" 2>/dev/null && wait "$ghostfs_pid" 2>/dev/null || true
  [ -n "$nginx_pid" ] && kill "$nginx_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

ghost_log "a local origin: nginx on 127.0.0.1 serving a generated site"
mkdir -p "$work/site/img" "$work/site/docs" "$mnt"
python3 - "$work/site" <<'PY'
import os, random, sys
root = sys.argv[1]
rng = random.Random(1)
with open(f"{root}/home.html", "w") as f:
    f.write("<html><body><h1>Ghost demo</h1>" + "".join(f"<img src='img/{i}.png'>" for i in range(4)) + "</body></html>\n")
for i in range(4):
    open(f"{root}/img/{i}.png", "wb").write(rng.randbytes(rng.randint(8_000, 60_000)))
open(f"{root}/docs/paper.pdf", "wb").write(rng.randbytes(2_000_000))
PY
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/nginx.conf" <<CONF
worker_processes 1; daemon off; user root; pid $work/nginx.pid; error_log $work/nginx-error.log;
events { worker_connections 64; }
http { access_log $work/access.log; client_body_temp_path $work/b; proxy_temp_path $work/p;
  fastcgi_temp_path $work/f; uwsgi_temp_path $work/u; scgi_temp_path $work/s;
  types { text/html html; image/png png; application/pdf pdf; }
  server { listen 127.0.0.1:$port; root $work/site; autoindex on; expires 1h; } }
CONF
nginx -c "$work/nginx.conf" -p "$work" & nginx_pid=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.1; done

ghost_log "mounting ghostfs on $mnt (profile ipaq-2004: emulated Microdrive + Cisco 350, knob 50)"
"$GHOST_BUILD/fs/ghostfs" -f --cache "$work/cache" --origin "www=http://127.0.0.1:$port/" \
  --profile ipaq-2004 --knob 50 --control "$ctl" "$mnt" 2>"$work/ghostfs.log" &
ghostfs_pid=$!
for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
mountpoint -q "$mnt" || { cat "$work/ghostfs.log"; exit 1; }
export GHOST_CONTROL=$ctl

echo; echo "\$ ls -l $mnt/www $mnt/www/img"
ls -l "$mnt/www" "$mnt/www/img"
echo; echo "\$ cat $mnt/www/home.html"
cat "$mnt/www/home.html"
echo; ghost_log "reading every file through the mount (first time: from the origin)"
time (find "$mnt/www" -type f -exec cat {} + | sha256sum)
echo; echo "\$ ghostctl flush   # deferred cache fills reach the (emulated) disk"
"$GHOST_BUILD/fs/ghostctl" flush
echo; ghost_log "reading again: the cost model picks the disk copy or the network per file"
time (find "$mnt/www" -type f -exec cat {} + | sha256sum)
echo; echo "\$ getfattr-like view of $mnt/www/img/0.png"
python3 - "$mnt/www/img/0.png" <<'PY'
import os, sys
for name in os.listxattr(sys.argv[1]):
    print(f"  {name} = {os.getxattr(sys.argv[1], name).decode()}")
PY
echo; echo "\$ ghostctl devices"; "$GHOST_BUILD/fs/ghostctl" devices
echo; echo "\$ ghostctl stats"; "$GHOST_BUILD/fs/ghostctl" stats
echo; ghost_log "ghostproxy on the same cache: a browser-style fetch of the page and its images, twice"
pport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$GHOST_BUILD/proxy/ghostproxy" --listen "127.0.0.1:$pport" --mount "$mnt" --control "$ctl" \
  --access-log "$work/proxy-access.log" 2>"$work/ghostproxy.log" &
proxy_pid=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$pport/ghost/status" >/dev/null && break; sleep 0.1; done
for round in 1 2; do
  echo "\$ wget -p -r -l 1 -e use_proxy=yes -e http_proxy=127.0.0.1:$pport .../home.html .../  # round $round"
  wget -q -p -r -l 1 -e robots=off -e use_proxy=yes -e "http_proxy=http://127.0.0.1:$pport" \
    -P "$work/dl-$round" "http://127.0.0.1:$port/home.html" "http://127.0.0.1:$port/"
done
echo "\$ cat proxy-access.log   # MISS: fetched; HIT: from the cache ghostfs and the proxy share; MEM_HIT: from the proxy's RAM copy"
awk '{ printf "  %-16s %s\n", $4, $7 }' "$work/proxy-access.log"
echo "\$ curl -sI -x 127.0.0.1:$pport http://127.0.0.1:$port/img/1.png | grep -i x-ghost"
curl -sI -x "127.0.0.1:$pport" "http://127.0.0.1:$port/img/1.png" | grep -i '^x-ghost' || true
echo "\$ curl -s http://127.0.0.1:$pport/ghost/status   # (excerpt)"
curl -s "http://127.0.0.1:$pport/ghost/status" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({k: d[k] for k in d if k in ("results", "cache", "requests", "ghost_hints")}, indent=1))'
kill "$proxy_pid"; wait "$proxy_pid" 2>/dev/null || true; proxy_pid=""

echo; ghost_log "unmounting"
fusermount3 -u "$mnt"
wait "$ghostfs_pid"; ghostfs_pid=""
echo "unmounted cleanly"

echo; ghost_log "simulating the shipped traces (common/traces) on ipaq-2004"
python3 "$GHOST_ROOT/scripts/sim_report.py" "$GHOST_BUILD/fs/ghostsim" "$GHOST_ROOT/common/traces" "$@"
