#!/usr/bin/env bash
# Checks that every relative link of the Markdown docs resolves: for each
# `](target)` in README.md, docs/*.md and bench/RESULTS.md, the target's
# path (without its #anchor), taken relative to the linking file, must
# exist. Links with a scheme (https:, mailto:) and bare #anchors are not
# checked. Prints each broken link as FILE:LINE: TARGET and exits 1 if
# there is any.
set -euo pipefail
cd "$(dirname "$0")/.."

broken=0
checked=0
for file in README.md docs/*.md bench/RESULTS.md; do
    dir=$(dirname "$file")
    # One "LINE:TARGET" per link; a line can hold several.
    while IFS=: read -r line target; do
        case "$target" in
            *://* | mailto:* | '#'*) continue ;;
        esac
        path=${target%%#*}
        checked=$((checked + 1))
        if [ ! -e "$dir/$path" ]; then
            echo "$file:$line: $target" >&2
            broken=$((broken + 1))
        fi
    done < <(grep -noE '\]\([^) ]+\)' "$file" | sed -E 's/^([0-9]+):\]\((.*)\)$/\1:\2/')
done

if [ "$broken" -gt 0 ]; then
    echo "check-docs: $broken of $checked relative links do not resolve" >&2
    exit 1
fi
echo "check-docs: $checked relative links, all resolve"
