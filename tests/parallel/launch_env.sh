#!/usr/bin/env bash
# launch_env.sh N COMMAND...: starts N copies of COMMAND on this host as torchrun starts its
# workers, without MPI: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and
# MASTER_PORT (a port nobody listens on, nor on the one after it, which brisk's rendezvous takes;
# below Linux's ephemeral ports, 32768 on, which connections take as their own; MASTER_PORT from
# the environment when set). Fails when any copy fails, ending the others then,
# as torchrun does, and names the rank that failed first.
set -u
n=$1
shift
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=${MASTER_PORT:-}
while [ -z "$port" ]; do
  port=$((20000 + RANDOM % 12000))
  if listening "$port" || listening $((port + 1)); then port=""; fi
done
declare -A rank_of
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port "$@" &
  rank_of[$!]=$r
done
# Each copy's status as it ends, in the order they end (wait -n). wait -n can find none of them
# when a copy it had already reaped is left; those are then waited for by pid.
status=0
declare -A running
for pid in "${!rank_of[@]}"; do running[$pid]=1; done
report() {
  unset "running[$1]"
  [ "$2" -eq 0 ] || [ "$status" -ne 0 ] || {
    status=$2
    how="exit code $2"
    [ "$2" -gt 128 ] && how="signal $(($2 - 128))"
    echo "launch_env.sh: rank ${rank_of[$1]} of $n ended with $how; ending the others" >&2
    for other in "${!running[@]}"; do kill "$other" 2>/dev/null; done
  }
}
while [ "${#running[@]}" -gt 0 ]; do
  pid=""
  wait -n -p pid "${!running[@]}"
  rc=$?
  if [ -z "${pid:-}" ]; then  # (wait -n unsets pid where it finds none)
    for pid in "${!running[@]}"; do
      wait "$pid"
      report "$pid" $?
    done
    break
  fi
  report "$pid" "$rc"
done
exit "$status"
