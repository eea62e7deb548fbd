#!/usr/bin/env bash
# shellcheck disable=SC2016  # single-quoted $VARS are for the jobs to expand
# Self-check of a cluster started by start.sh: fake GPUs, submit-time refusal, preemption with
# USR2 + requeue, sacct states, a 2-task srun, a job array, the node DOWN/resume drill.
# Exits non-zero at the first failure. Takes ~45 s (most of it the preemption grace time).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"
export SLURM_CONF=$SLURM_CONF_FILE

for d in "${DAEMONS[@]}"; do
  live_pid "$d" >/dev/null || { echo "FAIL: $d is not running (run start.sh first)" >&2; exit 1; }
done
if [[ -n $(squeue -h -o %i) ]]; then
  echo "FAIL: the queue is not empty; check.sh needs the whole node" >&2
  squeue >&2
  exit 1
fi

WORK=$(mktemp -d "$STATE/jobs/check.XXXXXX")
chmod 755 "$WORK"
cd "$WORK"  # jobs write their output relative to the submit directory
T0=$SECONDS
step=0
pass() { echo "ok $step - $* ($((SECONDS - T0)) s)"; }
fail() { echo "FAIL $step - $* (job files kept in $WORK)" >&2; exit 1; }
begin() { step=$((step + 1)); echo "# $step: $*"; }

# Waits until job $1 has left the queue and sacct reports a final state for its $3 (default 1)
# allocations (array tasks). Accounting lags the queue: records reach slurmdbd asynchronously.
wait_done() {
  local id=$1 limit=${2:-30} want=${3:-1} deadline states
  deadline=$((SECONDS + limit))
  while :; do
    if [[ -z $(squeue -h -j "$id" -o %i 2>/dev/null) ]]; then
      states=$(sacct -n -X -P -j "$id" -o State 2>/dev/null || true)
      if [[ $(grep -c . <<<"$states") -ge $want ]] && ! grep -qvE '^(COMPLETED|FAILED|CANCELLED.*|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)$' <<<"$states"; then
        return 0
      fi
    fi
    ((SECONDS < deadline)) || fail "job $id not finished after ${limit}s: $(squeue -h -j "$id" -o '%i %T %r' 2>/dev/null | tr '\n' ' ') sacct: $(sacct -n -X -P -j "$id" -o JobID,State 2>/dev/null | tr '\n' ' ')"
    sleep 0.5
  done
}
# scontrol, not sinfo: right after an update sinfo may still print the node's state from a cached table
# (seen: "mixed" just after state=down, once a second node and partition were in the cluster).
node_state() { scontrol -o show node "$NODE" | sed -n 's/.* State=\([^ ]*\).*/\1/p' | tr '[:upper:]' '[:lower:]'; }
state_of() { sacct -n -X -P -j "$1" -o State | head -1; }

begin "--gpus-per-node=8 sets CUDA_VISIBLE_DEVICES=0..7"
gpu=$(sbatch --parsable --gpus-per-node=8 -o gpu.out --wrap 'echo $CUDA_VISIBLE_DEVICES')
fails=$(sbatch --parsable -o fail.out --wrap 'exit 3')  # for step 4, runs alongside
wait_done "$gpu"
[[ $(cat gpu.out) == 0,1,2,3,4,5,6,7 ]] || fail "CUDA_VISIBLE_DEVICES='$(cat gpu.out)'"
pass "CUDA_VISIBLE_DEVICES=$(cat gpu.out)"

begin "--gpus-per-node=9 is refused at submit"
if out=$(sbatch --parsable --gpus-per-node=9 --wrap true 2>&1); then
  scancel "$out" 2>/dev/null || true
  fail "a 9-GPU job was accepted (id $out)"
fi
grep -q 'Requested node configuration is not available' <<<"$out" || fail "unexpected error: $out"
pass "refused: ${out##*error: }"

begin "sacct reports job states and exit codes"
wait_done "$fails"
# -X: one line per job allocation (without it, the .batch step follows).
line=$(sacct -j "$gpu" --format=JobID,State,ExitCode -P -n -X)
[[ $line == "$gpu|COMPLETED|0:0" ]] || fail "sacct for $gpu: '$line'"
line=$(sacct -j "$fails" --format=JobID,State,ExitCode -P -n -X)
[[ $line == "$fails|FAILED|3:0" ]] || fail "sacct for $fails: '$line'"
pass "$(sacct -j "$gpu,$fails" --format=JobID,State,ExitCode -P -n | tr '\n' ' ' | sed 's/ $//')"

begin "a 2-task job runs both tasks with srun"
two=$(sbatch --parsable --ntasks=2 -o two.out --wrap 'srun bash -c "echo task \$SLURM_PROCID of \$SLURM_NTASKS"')
arr=$(sbatch --parsable --array=0-3 -o 'arr_%A_%a.out' --wrap 'echo index $SLURM_ARRAY_TASK_ID')
wait_done "$two"
[[ $(sort two.out | tr '\n' ';') == "task 0 of 2;task 1 of 2;" ]] || fail "two.out: $(cat two.out)"
[[ $(state_of "$two") == COMPLETED ]] || fail "state $(state_of "$two")"
pass "$(sort two.out | tr '\n' ' ')"

begin "a job array --array=0-3 runs (and MaxArraySize=100 refuses index 100)"
wait_done "$arr" 30 4
for i in 0 1 2 3; do
  [[ $(cat "arr_${arr}_$i.out") == "index $i" ]] || fail "array task $i: $(cat "arr_${arr}_$i.out" 2>&1)"
done
n=$(sacct -n -X -P -j "$arr" -o JobID,State | grep -c '|COMPLETED$')
[[ $n -eq 4 ]] || fail "$n of 4 array tasks COMPLETED"
if out=$(sbatch --parsable --array=0-100 --wrap true 2>&1); then
  scancel "$out" 2>/dev/null || true
  fail "--array=0-100 accepted"
fi
pass "4 tasks COMPLETED; --array=0-100: ${out##*error: }"

begin "preemption: a low job gets USR2, is requeued when a high job takes the node, then runs again"
cat >low.sh <<'EOF'
#!/bin/bash
echo "start restart=${SLURM_RESTART_COUNT:-0}"
if [[ ${SLURM_RESTART_COUNT:-0} -gt 0 ]]; then echo "rerun done"; exit 0; fi
# The trap runs between two sleeps; keep running so that SLURM (not the job) requeues it.
trap 'echo "got USR2"' USR2
trap 'echo "got TERM"' TERM
for _ in $(seq 120); do sleep 1; done
echo "never preempted"
EOF
low=$(sbatch --parsable -p low --signal=B:USR2@10 --requeue --open-mode=append -o low.out low.sh)
deadline=$((SECONDS + 20))
until [[ $(squeue -h -j "$low" -o %T) == RUNNING ]] && grep -q '^start' low.out 2>/dev/null; do
  ((SECONDS < deadline)) || fail "low job $low did not start"
  sleep 0.3
done
high=$(sbatch --parsable -p high --exclusive -o high.out --wrap 'echo high ran; sleep 1')
deadline=$((SECONDS + 10))
until grep -q 'got USR2' low.out 2>/dev/null; do
  ((SECONDS < deadline)) || fail "no USR2 within 10 s of the high job: $(cat low.out)"
  sleep 0.3
done
echo "  USR2 received $((SECONDS - T0)) s; waiting for the grace time (10 s) + KillWait (5 s)"
seen=""
deadline=$((SECONDS + 60))
while :; do
  st=$(squeue -h -j "$low" -o %T 2>/dev/null || true)
  [[ -n $st && $st != "${seen##* }" ]] && seen="$seen $st"
  grep -q 'rerun done' low.out 2>/dev/null && [[ -z $st ]] && break
  ((SECONDS < deadline)) || fail "low job not rerun; states seen:$seen; log: $(cat low.out)"
  sleep 0.3
done
wait_done "$high"
wait_done "$low"
[[ $(cat high.out) == "high ran" ]] || fail "high.out: $(cat high.out)"
[[ $seen == *PENDING* ]] || fail "low job never PENDING after preemption; states seen:$seen"
# sacct -D (duplicates) lists every run of a requeued job: PREEMPTED, then COMPLETED.
runs=$(sacct -D -X -n -P -j "$low" -o State | tr '\n' ' ')
[[ $runs == "PREEMPTED COMPLETED " ]] || fail "sacct -D runs: $runs"
echo "  low.out: $(tr '\n' '|' <low.out)"
pass "states seen:$seen; sacct -D: $runs"

begin "node drill: DOWN under a running job requeues it; resume brings the node back"
drill=$(sbatch --parsable -o drill.out --open-mode=append --wrap 'echo run ${SLURM_RESTART_COUNT:-0}; sleep 2')
deadline=$((SECONDS + 20))
until grep -q '^run 0' drill.out 2>/dev/null; do
  ((SECONDS < deadline)) || fail "drill job did not start"
  sleep 0.3
done
scontrol update nodename="$NODE" state=down reason=check-drill
[[ $(node_state) == down* ]] || fail "node not down: $(node_state)"
scontrol update nodename="$NODE" state=resume
wait_done "$drill" 40
runs=$(sacct -D -X -n -P -j "$drill" -o State | tr '\n' ' ')
[[ $runs == "NODE_FAIL COMPLETED " ]] || fail "sacct -D runs: $runs"
[[ $(node_state) == idle ]] || fail "node not idle: $(node_state)"
pass "sacct -D: $runs; node $(node_state)"

if ((NODE_COUNT > 1)); then
  begin "a job of every node (partition wide) runs a task on each, with its own SLURMD_NODENAME"
  seen=$(timeout 60 srun -p wide -N "$NODE_COUNT" --ntasks-per-node=1 --gpus-per-node=1 \
    bash -c 'echo "$SLURMD_NODENAME $SLURM_JOB_NODELIST $CUDA_VISIBLE_DEVICES"' | sort | tr '\n' ' ') || fail "srun -N $NODE_COUNT failed"
  for name in "${NODE_NAMES[@]}"; do
    [[ $seen == *"$name "* ]] || fail "no task on $name: $seen"
  done
  pass "$seen"
fi

rm -rf "$WORK"
echo "all checks passed in $((SECONDS - T0)) s"
