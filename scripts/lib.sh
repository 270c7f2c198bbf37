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
  clang  # tests/proxy/fuzz_http1.sh: libFuzzer with ASan/UBSan (suite "fuzz")
  libnetfilter-queue-dev iptables iputils-ping
  scdoc  # doc/*.scd: the man pages, built at install
  dpkg-dev lintian  # scripts/make-deb.sh (dpkg-shlibdeps) and tests/integration/install_test.py
)

ghost_log() { printf '== %s\n' "$*" >&2; }

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

ghost_build() {
  if [ ! -f "$GHOST_BUILD/build.ninja" ]; then
    ghost_log "configuring $GHOST_BUILD"
    meson setup "$GHOST_BUILD" "$GHOST_ROOT" >/dev/null || return 1
  fi
  ghost_log "building"
  ninja -C "$GHOST_BUILD" >/dev/null || ninja -C "$GHOST_BUILD" || return 1
}
