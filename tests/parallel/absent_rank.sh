#!/usr/bin/env bash
# absent_rank.sh HOW COMMAND...: runs COMMAND, except on rank 1 of the launch (mpirun's
# OMPI_COMM_WORLD_RANK, else torchrun's RANK), which never joins: HOW=sleep sleeps far past any
# test's limit, HOW=exit exits at once with status 0 (a peer that never comes, for the start-up
# bound), HOW=flag runs COMMAND with a flag no brisk has (an error of rank 1 alone).
# tests/CMakeLists.txt runs it.
set -u
how=$1
shift
rank=${OMPI_COMM_WORLD_RANK:-${RANK:-0}}
if [ "$rank" = 1 ]; then
  case $how in
    sleep) exec sleep 600 ;;
    exit) exit 0 ;;
    flag) exec "$@" --no_such_flag_on_rank_1 1 ;;
    *) echo "absent_rank.sh: HOW is sleep, exit or flag, not $how" >&2; exit 2 ;;
  esac
fi
exec "$@"
