#!/usr/bin/env bash
# IMAP proxy benchmark (issue 14's goals): a cached body fetched through ghostproxy's IMAP
# proxy vs from dovecot directly, on loopback (p50/p95, the proxy may add at most 20%) and
# over the emulated 40 ms RTT link (scripts/linkemu.sh; one body and 1000 bodies, the proxy
# at least 10x faster). Median of 3 rounds with the spread. A few minutes.
#
#   scripts/bench-imap-proxy.sh [bench_imap_proxy.py options, e.g. --rounds 5 --no-link]
#
# Installs what is missing (dovecot-imapd fuse3), builds into GHOST_BUILD (default build/).
# Every process, mount and namespace it starts is removed on exit, also on failure or Ctrl-C.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

ghost_need_root bench-imap-proxy "it mounts ghostfs, starts dovecot and the link namespaces"
ghost_install
ghost_build
python3 "$ROOT/scripts/bench_imap_proxy.py" --build "$GHOST_BUILD" "$@"
