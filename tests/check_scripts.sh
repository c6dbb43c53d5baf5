#!/usr/bin/env bash
# Checks that the scripts a user or another script runs can be run: every committed file that
# opens with #! is committed executable, every shell script opens with #!, and every scripts/,
# bench/ or .ci/ path named in the README, the docs or a script exists.
#   bash tests/check_scripts.sh [repository root]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
failures=0
fail() {
  echo "check_scripts: $*" >&2
  failures=$((failures + 1))
}
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  listing=$(git ls-files -s)  # the modes as committed, which a fresh clone gets
else
  listing=$(find . -type f -not -path './build*' -not -path './.git/*' -printf '%m 0 0\t%P\n' |
    awk -F'\t' '{ split($1, m, " "); print (m[1] ~ /[1357]$/ ? "100755" : "100644") " 0 0\t" $2 }')
fi
files=()
while IFS=$'\t' read -r meta path; do
  mode=${meta%% *}
  [ -f "$path" ] || continue
  case "$path" in tests/fixtures/* | fuzz/corpus/*) continue ;; esac
  files+=("$path")
  opens_with_shebang=false
  [ "$(head -c2 "$path")" = "#!" ] && opens_with_shebang=true
  if $opens_with_shebang && [ "$mode" != 100755 ]; then
    fail "$path opens with #! but is not executable (git update-index --chmod=+x $path)"
  fi
  case "$path" in
    *.sh | .ci/run) $opens_with_shebang || fail "$path is a shell script without a #! line" ;;
  esac
done <<<"$listing"
# Paths that the README, the docs and the scripts name.
named=$(for f in "${files[@]}"; do
  case "$f" in README.md | CONTRIBUTING.md | docs/*.md | scripts/* | bench/* | .ci/*) cat "$f" ;; esac
done | grep -oE '(^|[^A-Za-z0-9_./-])(scripts|bench|\.ci)/[A-Za-z0-9_.-]+\.(sh|py)|\.ci/run' |
  sed -E 's/^[^.sb]*//' | sort -u)
for p in $named; do
  [ -f "$p" ] || fail "$p is named in the README, docs or scripts but does not exist"
done
if [ "$failures" -gt 0 ]; then
  echo "check_scripts: $failures problem(s)" >&2
  exit 1
fi
echo "check_scripts: ${#files[@]} files, $(echo "$named" | wc -w) named scripts: all runnable"
