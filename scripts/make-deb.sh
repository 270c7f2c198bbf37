#!/usr/bin/env bash
# Builds a Debian package of Ghost from `meson install` of an existing build directory:
#   scripts/make-deb.sh [BUILD_DIR [OUT_DIR]]     (defaults: $GHOST_BUILD or build/, and .)
# Prints the path of the .deb. No second build: the build directory is installed into a
# staging directory (DESTDIR) and packed with dpkg-deb. A build configured with another prefix
# than /usr (meson's default /usr/local) is moved to /usr in the staging tree; the programs
# find their profiles relative to their own directory, so they work there (common/power/
# profile.h ProfileDirCandidates). A release build uses `meson setup --prefix=/usr`.
# Depends: computed by dpkg-shlibdeps from the shared libraries the programs use.
# Check it with `lintian PACKAGE.deb` (tests/integration/install_test.py does): no error or
# warning. The informational tags left, and why: hardening-no-bindnow and
# hardening-no-fortify-functions (the flags are the build directory's; a release build sets
# them with `meson setup` from `dpkg-buildflags`), binary-has-unneeded-section .comment
# (meson's --strip keeps it), package-supports-alternative-init-but-no-init.d-script (systemd
# units only), systemd-service-file-missing-install-key for ghostproxy.service (started by
# ghostproxy.socket, on purpose), spelling-error-in-binary (false positives in help text).
# $GHOST_DEB_LEVEL: xz's compression level (default 6, dpkg's). The test of the sanitizer build
# packs ~150 MB: 1 takes a tenth of 6's CPU (~5 s against ~55 s for ghostfs alone) for a
# package ~20% larger.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

build=${1:-$GHOST_BUILD}
out=${2:-.}
package=ghostfs
# Who signs the package: the usual Debian variables, else a placeholder.
maintainer="${DEBFULLNAME:-Ghost maintainers} <${DEBEMAIL:-ghost@example.org}>"
arch=$(dpkg --print-architecture)
version=$(meson introspect --projectinfo "$build" | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')
prefix=$(meson introspect --buildoptions "$build" | python3 -c '
import json, sys
print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/$package

meson install -C "$build" --destdir "$stage" --no-rebuild --strip --quiet
if [ "$prefix" != /usr ]; then
  mkdir -p "$stage/usr"
  cp -a "$stage$prefix/." "$stage/usr/"
  rm -rf "${stage:?}$prefix"
  rmdir -p "$(dirname "$stage$prefix")" 2>/dev/null || true
  # The units name the programs by absolute path.
  find "$stage/usr/lib/systemd" -type f -exec sed -i "s|$prefix/bin/|/usr/bin/|g" {} +
fi
# Debian keeps man pages compressed.
find "$stage/usr/share/man" -type f -name '*.[0-9]' -exec gzip -9n {} +

doc=$stage/usr/share/doc/$package
mkdir -p "$doc"
cat > "$doc/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: ghost

Files: *
Copyright: 2026 the Ghost authors
License: Expat
 Permission is hereby granted, free of charge, to any person obtaining a copy of this
 software and associated documentation files (the "Software"), to deal in the Software
 without restriction, including without limitation the rights to use, copy, modify, merge,
 publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons
 to whom the Software is furnished to do so, subject to the following conditions:
 .
 The above copyright notice and this permission notice shall be included in all copies or
 substantial portions of the Software.
 .
 THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
 INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR
 PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE
 FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
 OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
 DEALINGS IN THE SOFTWARE.
COPYRIGHT
date=$(date -R -d "@${SOURCE_DATE_EPOCH:-$(git -C "$GHOST_ROOT" log -1 --format=%ct 2>/dev/null || date +%s)}")
{
  printf '%s (%s) unstable; urgency=medium\n\n' "$package" "$version"
  printf '  * Package built from meson install by scripts/make-deb.sh.\n\n'
  printf ' -- %s  %s\n' "$maintainer" "$date"
} | gzip -9n > "$doc/changelog.gz"

# Depends from the shared libraries the programs link (dpkg-shlibdeps wants a debian/control).
mkdir -p "$work/src/debian"
printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$package" "$package" > "$work/src/debian/control"
shlibdeps_args=()
for exe in "$stage"/usr/bin/*; do shlibdeps_args+=("-e$exe"); done
depends=$(cd "$work/src" && dpkg-shlibdeps -O "${shlibdeps_args[@]}" 2> >(grep -v "should already be installed" >&2) | sed -n 's/^shlibs:Depends=//p')
# mount.fuse3 and fusermount3 for mounting from fstab and the units.
depends="$depends, fuse3"

mkdir -p "$stage/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: $package
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Depends: $depends
Section: utils
Priority: optional
Description: energy-aware caching file system over HTTP(S) and IMAP
 Ghost mounts web sites and IMAP mailboxes as a FUSE file system
 (ghostfs) whose cache chooses, for each read, the disk or the network
 by the energy it costs, and runs the devices' power modes at a
 performance/energy knob. It includes an HTTP forward proxy over the
 same cache (ghostproxy), a control client (ghostctl), a trace
 simulator (ghostsim) and a trace generator (ghosttrace), with systemd
 units and man pages.
CONTROL
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$stage/DEBIAN/md5sums"
find "$stage" -type d -exec chmod 0755 {} +
deb=$out/${package}_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz -z"${GHOST_DEB_LEVEL:-6}" --build "$stage" "$deb" >/dev/null
echo "$deb"
