# Shared by scripts/demo.sh and scripts/test.sh: install what is missing, then build.
# Source it; it defines functions and changes nothing by itself.

GHOST_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GHOST_BUILD=${GHOST_BUILD:-$GHOST_ROOT/build}

# Debian packages the build and the tests need.
GHOST_PACKAGES=(
  g++ meson ninja-build pkg-config python3
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev
  libevent-dev libcurl4-openssl-dev libsqlite3-dev liburing-dev libfuse3-dev fuse3
  nginx-light curl wget
  chromium  # tests/integration/ghostproxy_test.py: a real browser through the proxy
  dovecot-imapd libssl-dev  # IMAP origin tests (tests/common/dovecot_fixture.h), TLS
  neomutt tmux  # tests/integration/ghostfs_imap_neomutt_test.py: a Maildir reader on the mount
  openssl  # tests/integration/ghostfs_imap_bad_test.py: a CA and server certificate for imaps://
  clang  # tests/fuzz/fuzz.sh: libFuzzer with ASan/UBSan (suite "fuzz")
  libnetfilter-queue-dev iptables iputils-ping
  scdoc  # fs/man, proxy/man: the man pages, built at install
  dpkg-dev lintian  # scripts/make-deb.sh (dpkg-shlibdeps) and tests/integration/install_test.py
  libisal-dev  # common/cache/flash_log.cc: CRC32C of the flash log (crc32_iscsi)
  libnl-3-dev libnl-genl-3-dev libcap-dev  # common/power/real_wifi.cc, hardware.cc: nl80211, capabilities
  python3-aiosmtpd  # tests/integration/ghostproxy_smtp_test.py: the SMTP server behind the outbox
  python3-matplotlib  # scripts/plots.py and tests/integration/plots_test.py
  wrk squid  # scripts/bench-scale.sh, scripts/bench-proxy.sh: load generator and the peer cache
  python3-websocket  # tests/integration/ghostproxy_dashboard_test.py: Chromium DevTools protocol
  libpcap-dev tcpdump  # proxy/arrival_tap.cc (per-packet arrivals), scripts/bench-shaping.sh captures
  isync offlineimap3  # tests/integration/ghostproxy_imap_clients_test.py: real IMAP sync clients through the proxy
  zlib1g-dev  # common/cache/cache_store.cc: the stored response heads, deflated
)

# The programs scripts/test.sh builds first (the live replay's: the daemons, ghostsim, the link
# emulator's delayer), before the replay and the tests of suite early start beside the rest of
# the build; tests/cli/early_suite_test.py checks that those tests need nothing else.
GHOST_FIRST_TARGETS=(fs/ghostfs fs/ghostctl fs/ghostsim proxy/ghostproxy tests/linkemu/nfq_delay)

ghost_log() { printf '== %s\n' "$*" >&2; }

# ghost_need_root NAME WHY: exits 1 with "NAME: run as root (WHY)" unless run as root.
ghost_need_root() {
  [ "$(id -u)" -eq 0 ] && return 0
  echo "$1: run as root ($2)" >&2
  exit 1
}

# Installs the packages that are not installed yet (apt-get update only if needed).
ghost_install() {
  local missing=()
  for p in "${GHOST_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "ghost: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
    return 1
  fi
  ghost_log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || return 1
  apt-get install -y -qq "${missing[@]}" >/dev/null || return 1
}

# ghost_configure DIR [MESON OPTION...]: configures DIR with the options the first time (an
# existing tree gets the same options).
ghost_configure() {
  local dir=$1
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    ghost_log "configuring $dir${*:+ ($*)}"
    meson setup "$dir" "$GHOST_ROOT" "$@" >/dev/null || return 1
  elif [ $# -gt 0 ]; then
    meson configure "$dir" "$@" >/dev/null || return 1
  fi
}

# ghost_ninja DIR [TARGET...]: builds the targets (everything by default) in a configured DIR;
# quiet unless it fails, then once more to show the errors. $GHOST_NINJA_PREFIX, if set, is the
# command it runs under (scripts/test.sh: chrt --idle 0).
ghost_ninja() {
  local dir=$1
  shift
  ghost_log "building $dir${*:+ ($*)}"
  ${GHOST_NINJA_PREFIX:-} ninja -C "$dir" "$@" >/dev/null || ${GHOST_NINJA_PREFIX:-} ninja -C "$dir" "$@" || return 1
}

# ghost_build [DIR [MESON OPTION...]]: configures DIR (default $GHOST_BUILD) with the options
# the first time, then builds everything in it.
ghost_build() {
  local dir=${1:-$GHOST_BUILD}
  [ $# -gt 0 ] && shift
  ghost_configure "$dir" "$@" && ghost_ninja "$dir"
}
