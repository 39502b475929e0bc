#!/usr/bin/env bash
# Render a `ringway lab sip` report (index.html) and its SVG plots to PNG
# with headless Chromium, to look at what a reader sees.
#
# Usage: bench/siplab/render-report.sh REPORT_DIR [WIDTH]
#   writes REPORT_DIR/render/index.png (the whole page, WIDTH px wide,
#   default 1400) and one PNG per *.svg.
# Needs Debian's `chromium` (apt-get install chromium); a fresh profile
# directory is used and removed, nothing is fetched from the network.
set -Eeuo pipefail
trap 'rc=$?; echo "render-report.sh: line $LINENO: \"$BASH_COMMAND\" failed (exit $rc)" >&2' ERR

dir="${1:?usage: render-report.sh REPORT_DIR [WIDTH]}"
width="${2:-1400}"
command -v chromium >/dev/null || { echo "render-report.sh: chromium not installed (apt-get install chromium)" >&2; exit 2; }
[[ -f "$dir/index.html" ]] || { echo "render-report.sh: no $dir/index.html" >&2; exit 2; }
dir="$(cd "$dir" && pwd)"
out="$dir/render"
mkdir -p "$out"
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT

shot() { # file.html|svg output.png height
    chromium --headless --no-sandbox --disable-gpu --disable-background-networking \
        --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
        --user-data-dir="$profile" --window-size="$width,$3" --screenshot="$2" "file://$1" \
        >/dev/null 2>&1
    [[ -s "$2" ]] || { echo "render-report.sh: no screenshot of $1" >&2; return 1; }
}

# The page height: a generous estimate from the number of table rows and images.
rows=$(grep -o '<tr>' "$dir/index.html" | wc -l)
imgs=$(grep -o '<img ' "$dir/index.html" | wc -l)
height=$((800 + rows * 26 + imgs * 620))
shot "$dir/index.html" "$out/index.png" "$height"
for svg in "$dir"/*.svg; do
    [[ -e "$svg" ]] || continue
    h=$(grep -o 'height="[0-9.]*"' "$svg" | head -1 | tr -dc '0-9.')
    shot "$svg" "$out/$(basename "${svg%.svg}").png" "${h%.*}"
done
echo "rendered: $out"
ls -1 "$out"
