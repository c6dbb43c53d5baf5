#!/usr/bin/env bash
# launch_env.sh N COMMAND...: starts N copies of COMMAND on this host as torchrun starts its
# workers, without MPI: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and
# MASTER_PORT (a port nobody listens on, nor on the one after it, which brisk's rendezvous takes;
# MASTER_PORT from the environment when set). Fails when any copy fails, ending the others then,
# as torchrun does, and names the rank that failed first.
set -u
n=$1
shift
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=${MASTER_PORT:-}
while [ -z "$port" ]; do
  port=$((20000 + RANDOM % 40000))
  if listening "$port" || listening $((port + 1)); then port=""; fi
done
declare -A rank_of
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port "$@" &
  rank_of[$!]=$r
done
status=0
for ((left = n; left > 0; left--)); do
  wait -n -p pid
  rc=$?
  [ "$rc" -eq 0 ] || [ "$status" -ne 0 ] || {
    status=$rc
    how="exit code $rc"
    [ "$rc" -gt 128 ] && how="signal $((rc - 128))"
    echo "launch_env.sh: rank ${rank_of[$pid]} of $n ended with $how; ending the others" >&2
    for other in "${!rank_of[@]}"; do [ "$other" = "$pid" ] || kill "$other" 2>/dev/null; done
  }
done
exit "$status"
