#!/bin/bash
# build-deb.sh - build the Debian package from binaries already built.
#
#   packaging/build-deb.sh [BINDIR [OUTDIR]]
#       BINDIR  where ptraind and ptrain are (default target/release)
#       OUTDIR  where the .deb goes (default target/debian)
#   make deb    builds the release binaries, then runs this
#
# Stages `make install` (binaries, units, D-Bus policy, tmpfiles.d, the
# default config, man pages, completions, docs) in a scratch tree, strips
# the binaries as dh_strip would, adds the control files from
# packaging/debian/ and builds OUTDIR/ptrain_VERSION_ARCH.deb with dpkg-deb,
# every file owned by root whoever runs it. Prints the package's path.
#
# Needs bash, make, dpkg-deb; objdump and strip (binutils) when present.
# Environment: DEB_MAINTAINER (the Maintainer field), DEB_COMPRESSION (xz,
# the default, or gzip, zstd, none), SOURCE_DATE_EPOCH (man page dates).
set -euo pipefail
umask 022

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "build-deb.sh: $*" >&2; exit 1; }

BINDIR=${1:-$REPO/target/release}
OUT=${2:-$REPO/target/debian}
[ -d "$BINDIR" ] || die "$BINDIR is not a directory; run make build first"
BINDIR=$(cd "$BINDIR" && pwd)
for b in ptraind ptrain; do
    [ -x "$BINDIR/$b" ] || die "$BINDIR/$b is missing; run make build first"
done
command -v dpkg-deb >/dev/null || die "dpkg-deb not found; apt-get install dpkg"
# Set DEB_MAINTAINER to the address that answers for this build; the
# default is a placeholder with a well-formed host, as lintian requires.
MAINTAINER=${DEB_MAINTAINER:-ptrain maintainers <ptrain@example.org>}
COMPRESSION=${DEB_COMPRESSION:-xz}

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/ptrain-deb.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
ROOT=$STAGE/root
GEN=$STAGE/generated

# The same files `make install` puts on any other distribution.
make -C "$REPO" --no-print-directory -s install BINDIR="$BINDIR" GENDIR="$GEN" DESTDIR="$ROOT" >/dev/null
install -D -m 0644 "$REPO/packaging/debian/copyright" "$ROOT/usr/share/doc/ptrain/copyright"
install -D -m 0644 "$REPO/packaging/debian/lintian-overrides" "$ROOT/usr/share/lintian/overrides/ptrain"
if command -v strip >/dev/null; then
    strip --strip-unneeded --remove-section=.comment --remove-section=.note \
        "$ROOT/usr/sbin/ptraind" "$ROOT/usr/bin/ptrain"
fi

VERSION=$("$BINDIR/ptrain" --version | awk '{print $2}')
[[ $VERSION =~ ^[0-9][A-Za-z0-9.+~-]*$ ]] || die "ptrain --version gave no usable version ('$VERSION')"
ARCH=$(dpkg --print-architecture)
# The newest glibc symbol version the binaries use; else the installed libc6.
GLIBC=
if command -v objdump >/dev/null; then
    GLIBC=$(objdump -T "$BINDIR/ptraind" "$BINDIR/ptrain" | grep -o 'GLIBC_[0-9][0-9.]*' |
        sed 's/^GLIBC_//' | sort -Vu | tail -n 1) || GLIBC=
fi
if [ -z "$GLIBC" ]; then
    GLIBC=$(dpkg-query -W -f='${Version}' libc6 | sed 's/-.*//')
fi
# A native package's changelog.gz (Debian policy 12.7): one entry for this
# build, dated by SOURCE_DATE_EPOCH, else the last commit, so rebuilds of
# one commit are identical.
WHEN=${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s)}
COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
{
    echo "ptrain ($VERSION) unstable; urgency=medium"
    echo
    echo "  * Built from commit $COMMIT by packaging/build-deb.sh; what changed is"
    echo "    in the project's history (git log)."
    echo
    echo " -- $MAINTAINER  $(LC_ALL=C date -u -R -d "@$WHEN")"
} | gzip -9n > "$ROOT/usr/share/doc/ptrain/changelog.gz"
chmod 0644 "$ROOT/usr/share/doc/ptrain/changelog.gz"
SIZE=$(du -sk --apparent-size "$ROOT" | cut -f1)

install -d -m 0755 "$ROOT/DEBIAN"
sed -e "s|@VERSION@|$VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@MAINTAINER@|$MAINTAINER|" \
    -e "s|@INSTALLED_SIZE@|$SIZE|" -e "s|@GLIBC@|$GLIBC|" \
    "$REPO/packaging/debian/control.in" > "$ROOT/DEBIAN/control"
chmod 0644 "$ROOT/DEBIAN/control"
install -m 0644 "$REPO/packaging/debian/conffiles" "$ROOT/DEBIAN/"
install -m 0755 "$REPO/packaging/debian/postinst" "$REPO/packaging/debian/prerm" \
    "$REPO/packaging/debian/postrm" "$ROOT/DEBIAN/"
# What dh_md5sums writes: every file but the conffiles, for `dpkg --verify`.
(cd "$ROOT" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\0' |
    LC_ALL=C sort -z | xargs -0 md5sum) > "$ROOT/DEBIAN/md5sums"
chmod 0644 "$ROOT/DEBIAN/md5sums"
# mktemp made it 0700; it becomes the package's "./".
chmod 0755 "$ROOT"

mkdir -p "$OUT"
DEB=$(cd "$OUT" && pwd)/ptrain_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Z"$COMPRESSION" --build "$ROOT" "$DEB" >/dev/null
echo "$DEB"
