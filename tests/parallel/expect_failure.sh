#!/usr/bin/env bash
# expect_failure.sh PATTERN SECONDS COMMAND...: passes when COMMAND fails (non-zero exit) within
# SECONDS and its output (stdout and stderr) contains PATTERN (an extended regular expression);
# with EXPECT_LINES=n, exactly n lines of it match; with EXPECT_ERROR_LINES=n, exactly n lines
# are brisk's error lines ("brisk: error", whatever the rank).
set -u
pattern=$1 limit=$2
shift 2
out=$(timeout "$limit" "$@" 2>&1)
rc=$?
echo "$out" | tail -20
if [ "$rc" -eq 0 ]; then echo "expected a failure, the command succeeded"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "the command hung: still running after $limit s"; exit 1; fi
if ! echo "$out" | grep -Eq "$pattern"; then echo "no line matches: $pattern"; exit 1; fi
if [ -n "${EXPECT_LINES:-}" ]; then
  n=$(echo "$out" | grep -Ec "$pattern")
  if [ "$n" -ne "$EXPECT_LINES" ]; then echo "$n lines match, expected $EXPECT_LINES"; exit 1; fi
fi
if [ -n "${EXPECT_ERROR_LINES:-}" ]; then
  n=$(echo "$out" | grep -c "^brisk: error")
  if [ "$n" -ne "$EXPECT_ERROR_LINES" ]; then
    echo "$n error lines, expected $EXPECT_ERROR_LINES"
    exit 1
  fi
fi
echo "failed as expected (exit $rc)"
