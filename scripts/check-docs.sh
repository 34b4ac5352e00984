#!/usr/bin/env bash
# Checks that every relative link of the Markdown docs resolves: for each
# `](target)` in README.md, docs/*.md and bench/RESULTS.md, the target's
# path (without its #anchor), taken relative to the linking file, must
# exist. Links with a scheme (https:, mailto:) and bare #anchors are not
# checked. Prints each broken link as FILE:LINE: TARGET and exits 1 if
# there is any. Then: the README stays under 250 lines, and no tracked
# file speaks of the project's making (numbered sessions or issues, the
# team's design card).
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

# The README is a user's guide: it stays short (the rest is in docs/).
readme_lines=$(wc -l <README.md)
if [ "$readme_lines" -ge 250 ]; then
    echo "check-docs: README.md has $readme_lines lines (a user's guide stays under 250; move detail to docs/)" >&2
    exit 1
fi
# The repository speaks of the project: no notes of its own making.
if git grep -qniE '\bsessions? [0-9]|\bissues? ?#?[0-9]+\b|DESIGN\.md' -- . 2>/dev/null; then
    echo "check-docs: these lines speak of how the project was made, not of the project:" >&2
    git grep -niE '\bsessions? [0-9]|\bissues? ?#?[0-9]+\b|DESIGN\.md' -- . >&2
    exit 1
fi
echo "check-docs: README.md $readme_lines lines; no notes of the project's making"
