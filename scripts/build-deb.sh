#!/usr/bin/env bash
# Build target/debian/ringway_VERSION_ARCH.deb with dpkg-deb from a staging
# directory (no cargo-deb needed, works offline): the release binary, the
# sample configuration as /etc/ringway/ringway.toml (a conffile), a man
# page, the systemd units (contrib/systemd/: ringway.service for the SIP
# proxy, ringway-dispatch.service, ringway-sfu.service) and the Grafana
# dashboard (contrib/grafana/ringway.json).
# Usage: scripts/build-deb.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" != "--no-build" ]]; then
    cargo build --release -p ringway
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
stage=target/debian/stage
rm -rf "$stage"
install -D -m 0755 target/release/ringway "$stage/usr/bin/ringway"
strip --strip-debug "$stage/usr/bin/ringway" 2>/dev/null || true
install -D -m 0644 docs/ringway.toml "$stage/etc/ringway/ringway.toml"
for unit in ringway ringway-dispatch ringway-sfu; do
    install -D -m 0644 "contrib/systemd/$unit.service" "$stage/lib/systemd/system/$unit.service"
done
install -D -m 0644 contrib/grafana/ringway.json "$stage/usr/share/doc/ringway/grafana/ringway.json"
install -D -m 0644 docs/operations.md "$stage/usr/share/doc/ringway/operations.md"
mkdir -p "$stage/usr/share/man/man1"
# The man page: what `ringway --help` says, as roff.
{
    echo ".TH RINGWAY 1 \"\" \"ringway $version\" \"User Commands\""
    echo ".SH NAME"
    echo "ringway \\- fast UDP packet-switching servers (SIP proxy, SFU, SRPIC)"
    echo ".SH SYNOPSIS"
    echo ".B ringway"
    echo "\\fICOMMAND\\fR [\\fIOPTIONS\\fR]"
    echo ".SH DESCRIPTION"
    echo ".nf"
    "$stage/usr/bin/ringway" --help | sed 's/\\/\\\\/g; s/^\./\\\&./'
    for cmd in "sip proxy" "sip dispatch" "sfu serve" "ctl"; do
        echo
        echo ".SH \"RINGWAY $(echo "$cmd" | tr a-z A-Z)\""
        # shellcheck disable=SC2086
        "$stage/usr/bin/ringway" $cmd --help | sed 's/\\/\\\\/g; s/^\./\\\&./'
    done
    echo ".fi"
    echo ".SH FILES"
    echo "/etc/ringway/ringway.toml, /run/ringway/ringway.sock"
    echo ".SH SEE ALSO"
    echo "/usr/share/doc/ringway/operations.md"
} | gzip -9n > "$stage/usr/share/man/man1/ringway.1.gz"
mkdir -p "$stage/DEBIAN"
echo "/etc/ringway/ringway.toml" > "$stage/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: ringway
Version: $version
Architecture: $arch
Maintainer: ringway developers <ringway@localhost>
Installed-Size: $size
Depends: libc6
Section: net
Priority: optional
Description: fast UDP packet-switching servers
 A SIP proxy, registrar and dispatcher, an SFU for networked music and the
 SRPIC reordering sorter, with systemd units (ringway.service: the SIP
 proxy; ringway-dispatch.service, ringway-sfu.service) and a Grafana
 dashboard.
CONTROL
cat > "$stage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
POSTINST
chmod 0755 "$stage/DEBIAN/postinst"
out="target/debian/ringway_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$stage" "$out" >/dev/null
echo "$out"
