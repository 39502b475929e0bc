#!/usr/bin/env bash
# Build the .deb (scripts/build-deb.sh), install it into a throwaway root
# with dpkg, run the installed `ringway --version`, check the conffile and
# the man page, `systemd-analyze verify` the installed units, and parse the
# dashboard.
set -euo pipefail
cd "$(dirname "$0")/.."
deb=$(scripts/build-deb.sh "$@" | tail -1)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/info"
touch "$root/var/lib/dpkg/status"
dpkg --root="$root" --force-not-root --force-depends --force-script-chrootless \
    --log=/dev/null --install "$deb" >/dev/null
grep -qx "Status: install ok installed" "$root/var/lib/dpkg/status"
version=$("$root/usr/bin/ringway" --version)
echo "installed: $version"
[[ "$version" =~ ^ringway\ [0-9.]+\ \(commit\ [0-9a-f]{7,}|unknown ]] || { echo "bad --version: $version" >&2; exit 1; }
grep -qx /etc/ringway/ringway.toml "$root/var/lib/dpkg/info/ringway.conffiles"
"$root/usr/bin/ringway" config check "$root/etc/ringway/ringway.toml" >/dev/null
zcat "$root/usr/share/man/man1/ringway.1.gz" | grep -q '^\.TH RINGWAY 1'
for name in ringway ringway-dispatch ringway-sfu; do
    unit="$root/lib/systemd/system/$name.service"
    grep -qx 'Type=notify' "$unit"
    # The unit runs /usr/bin/ringway: point verify at the installed one.
    sed "s|/usr/bin/ringway|$root/usr/bin/ringway|" "$unit" > "$root/$name.service"
    systemd-analyze verify --man=no "$root/$name.service"
done
python3 -m json.tool "$root/usr/share/doc/ringway/grafana/ringway.json" >/dev/null
echo "deb ok: $deb"
