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
# Each copy's status as it ends (polled: `wait -n` can miss a copy that ended before it was
# called, and then reports no process at all).
status=0
declare -A running
for pid in "${!rank_of[@]}"; do running[$pid]=1; done
while [ "${#running[@]}" -gt 0 ]; do
  for pid in "${!running[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    wait "$pid"
    rc=$?
    unset "running[$pid]"
    [ "$rc" -eq 0 ] || [ "$status" -ne 0 ] || {
      status=$rc
      how="exit code $rc"
      [ "$rc" -gt 128 ] && how="signal $((rc - 128))"
      echo "launch_env.sh: rank ${rank_of[$pid]} of $n ended with $how; ending the others" >&2
      for other in "${!running[@]}"; do kill "$other" 2>/dev/null; done
    }
  done
  [ "${#running[@]}" -eq 0 ] || sleep 0.1
done
exit "$status"
