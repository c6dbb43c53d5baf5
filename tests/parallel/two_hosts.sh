#!/usr/bin/env bash
# two_hosts.sh BRISK WORK_DIR: one training job on two hosts, stood in for by two network
# namespaces joined by a veth pair (10.77.0.1 and 10.77.0.2; each host's name still resolves to
# loopback, as on many real machines), and on one host; the saved weights must be the same bytes.
#   1. torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=10.77.0.1), one rank per
#      host, without GLOO_SOCKET_IFNAME: the ranks find the interface that reaches MASTER_ADDR;
#   2. mpirun --host 10.77.0.1,10.77.0.2 (its remote daemon started in the second namespace);
#   3. mpirun -np 2 on one host, the reference.
# Exits 77 (ctest's skip), saying why, where network namespaces cannot be made (not root, no ip).
set -u
brisk=$1
work=$2
skip() {
  echo "two_hosts.sh: skipped: $1"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
command -v ip >/dev/null 2>&1 || skip "iproute2's ip is not installed"
command -v mpirun >/dev/null 2>&1 || skip "mpirun is not installed"

tag=brisk$$
a=${tag}a
b=${tag}b
cleanup() {
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  return 0
}
trap cleanup EXIT
ip netns add "$a" 2>/dev/null || skip "ip netns add failed (no network namespaces here)"
ip netns add "$b" || exit 1
ip link add "${tag}x" type veth peer name "${tag}y" 2>/dev/null || skip "no veth pairs here"
ip link set "${tag}x" netns "$a" && ip link set "${tag}y" netns "$b" || exit 1
ip -n "$a" addr add 10.77.0.1/24 dev "${tag}x" && ip -n "$b" addr add 10.77.0.2/24 dev "${tag}y"
ip -n "$a" link set lo up && ip -n "$a" link set "${tag}x" up || exit 1
ip -n "$b" link set lo up && ip -n "$b" link set "${tag}y" up || exit 1

rm -rf "$work"
mkdir -p "$work"
job=(train --model bert-tiny --max_steps 3 --seq_len 16 --dataset_size 16
  --per_device_train_batch_size 2 --disable_tqdm --save_strategy no)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME

# 1. torchrun's variables, one rank in each namespace.
pids=()
for rank in 0 1; do
  ns=$a
  [ "$rank" -eq 1 ] && ns=$b
  ip netns exec "$ns" env RANK=$rank WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
    MASTER_ADDR=10.77.0.1 MASTER_PORT=29400 timeout 120 "$brisk" "${job[@]}" \
    --output_dir "$work/torchrun" >"$work/torchrun_rank$rank.log" 2>&1 &
  pids+=($!)
done
status=0
for rank in 0 1; do
  wait "${pids[$rank]}" || {
    status=1
    echo "two_hosts.sh: rank $rank under torchrun's variables failed:"
    tail -n 5 "$work/torchrun_rank$rank.log"
  }
done

# 2. mpirun across the two namespaces: its rsh agent starts the remote daemon in the second.
agent=$work/agent.sh
cat >"$agent" <<EOF
#!/usr/bin/env bash
while [[ "\$1" == -* ]]; do shift; done
case \$1 in 10.77.0.1) ns=$a ;; 10.77.0.2) ns=$b ;; *) echo "unknown host \$1" >&2; exit 1 ;; esac
shift
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod +x "$agent"
ip netns exec "$a" timeout 120 mpirun -np 2 --host 10.77.0.1,10.77.0.2 \
  --mca plm_rsh_agent "$agent" -x OMP_NUM_THREADS "$brisk" "${job[@]}" \
  --output_dir "$work/mpirun_hosts" >"$work/mpirun_hosts.log" 2>&1 || {
  status=1
  echo "two_hosts.sh: mpirun --host over the two namespaces failed:"
  tail -n 5 "$work/mpirun_hosts.log"
}

# 3. The reference: mpirun -np 2 on this host.
OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 mpirun -np 2 --oversubscribe \
  "$brisk" "${job[@]}" --output_dir "$work/one_host" >"$work/one_host.log" 2>&1 || {
  echo "two_hosts.sh: mpirun -np 2 on one host failed:"
  tail -n 5 "$work/one_host.log"
  exit 1
}
for run in torchrun mpirun_hosts; do
  [ -f "$work/$run/model.safetensors" ] || continue
  if cmp -s "$work/one_host/model.safetensors" "$work/$run/model.safetensors"; then
    echo "two_hosts.sh: $run on two hosts saved the weights of mpirun -np 2 on one host"
  else
    status=1
    echo "two_hosts.sh: $run on two hosts saved other weights than mpirun -np 2 on one host"
  fi
done
exit "$status"
