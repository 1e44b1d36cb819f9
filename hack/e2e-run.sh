#!/usr/bin/env bash
# Runs end-to-end tests from one pool across every test binary, JOBS at a time, the longest first.
# `cargo test` runs its test binaries one after another, so while a binary's last long test ran
# the other slots stood idle: minutes per binary, a quarter of `make test` on 2 cores.
#
# usage: hack/e2e-run.sh [--jobs N] [--heavy BINARIES --heavy-jobs M] [--ignored | --include-ignored]
#                        [--skip SUBSTRING]... [--only SUBSTRING]... [--except BINARIES]
#                        -- CARGO_TEST_ARGS...
#   CARGO_TEST_ARGS choose the test binaries (`-p noops-e2e --test node_faults`); --except leaves
#   out the binaries whose names match BINARIES (a regular expression, as --heavy); --ignored runs
#   only the ignored tests, --include-ignored those and the others; --skip leaves out the tests
#   whose names contain SUBSTRING; with --only, only tests whose names contain one of them run
#   (a SUBSTRING may hold glob patterns: `every_node*etcd`); the tests
#   of the binaries named in BINARIES (`clusters|machines`, a regular expression on the binary's
#   name) run at most M at a time: each runs whole tenant clusters of machines, and the longest
#   tests, started together, were four of them at once on 2 cores.
# Each test runs alone in its binary (`--exact`), its output in .noops/e2e-logs/, printed whole
# if it fails. Seconds per test are appended to .noops/e2e-times.tsv and order the next run; a
# fresh clone orders by tests/e2e/expected-seconds.tsv.
set -euo pipefail
# Read whole before it runs (the braces, closed by `exit`): an edit during a long run cannot
# change what the running copy does next.
{
root=$(cd "$(dirname "$0")/.." && pwd)

jobs=4
heavy='^$'
heavy_jobs=0
except='^$'
ignored=()
skips=()
onlys=()
while (($#)); do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --heavy) heavy="^($2)\$"; shift 2 ;;
    --heavy-jobs) heavy_jobs=$2; shift 2 ;;
    --except) except="^($2)\$"; shift 2 ;;
    --ignored) ignored=(--ignored); shift ;;
    --include-ignored) ignored=(--include-ignored); shift ;;
    --skip) skips+=("$2"); shift 2 ;;
    --only) onlys+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "e2e-run: unknown argument $1" >&2; exit 2 ;;
  esac
done

logs=$root/.noops/e2e-logs
times=$root/.noops/e2e-times.tsv
mkdir -p "$logs"

# Build once; the executables are the integration-test targets (not the crate's own binaries).
# A build that fails stops the run, with the compiler's words (the JSON hides them).
if ! built=$(cargo test --quiet --no-run --message-format=json "$@"); then
  cargo test --no-run "$@" || true
  echo "e2e-run: the tests do not build" >&2
  exit 1
fi
mapfile -t binaries < <(grep '"kind":\["test"\]' <<<"$built" | grep -o '"executable":"[^"]*"' | cut -d'"' -f4)
((${#binaries[@]})) || { echo "e2e-run: no test binary in: $*" >&2; exit 2; }

plan=$(mktemp)
run_times=$(mktemp)
trap 'rm -f "$plan" "$run_times"' EXIT
# Interrupted, the tests running go too (background jobs of a script ignore SIGINT).
trap 'kill $(jobs -p) 2>/dev/null; exit 130' INT TERM
tests_of() { "$1" --list --format terse "${@:2}" | sed -n 's/: test$//p' | sort; }
for binary in "${binaries[@]}"; do
  [[ $(basename "${binary%-*}") =~ $except ]] && continue
  # `--list` names the ignored tests too; `--list --ignored` only them.
  case "${ignored[*]}" in
    --ignored) names=$(tests_of "$binary" --ignored) ;;
    --include-ignored) names=$(tests_of "$binary") ;;
    *) names=$(comm -23 <(tests_of "$binary") <(tests_of "$binary" --ignored)) ;;
  esac
  while read -r name; do
    [[ -n $name ]] || continue
    # shellcheck disable=SC2053 # unquoted on purpose: a substring may be a glob
    for skip in "${skips[@]}"; do [[ $name == *$skip* ]] && continue 2; done
    if ((${#onlys[@]})); then
      wanted=
      for only in "${onlys[@]}"; do [[ $name == *$only* ]] && wanted=1; done
      [[ -n $wanted ]] || continue
    fi
    printf '%s\t%s\n' "$binary" "$name" >>"$plan"
  done <<<"$names"
done

# Longest first, so the last tests to start are short ones; a test never timed counts a minute.
hints=$root/tests/e2e/expected-seconds.tsv
touch "$times"
ordered=$(awk -F'\t' -v plan="$plan" 'FILENAME != plan { secs[$2] = $1; next }
  { print (($2 in secs) ? secs[$2] : 60) "\t" $0 }' "$hints" "$times" "$plan" |
  sort -t$'\t' -k1,1rn | cut -f2-)
total=$(wc -l <"$plan")
if ((total == 0)); then
  echo "e2e-run: no test to run in: $*"
  exit 0
fi
echo "e2e-run: $total tests from ${#binaries[@]} binaries, $jobs at a time"

run_one() {
  local binary=$1 name=$2 started=$SECONDS result=ok
  local log=$logs/$(basename "${binary%-*}")-$name.log
  # Uncaptured: a passing test's log says where its time went too.
  "$binary" --exact "$name" --test-threads=1 --nocapture "${ignored[@]}" >"$log" 2>&1 || result=FAILED
  local secs=$((SECONDS - started))
  printf '%-6s %4ss  %s\n' "$result" "$secs" "$name"
  # One short append per test: lines of tests ending together never mix.
  printf '%s\t%s\t%s\t%s\n' "$secs" "$name" "$result" "$log" >>"$run_times"
}

is_heavy() {
  local base
  base=$(basename "${1%-*}")
  ((heavy_jobs > 0)) && [[ $base =~ $heavy ]]
}
# The next test in order that may start now: a heavy one only below its own limit.
mapfile -t queue <<<"$ordered"
heavy_pids=()
while ((${#queue[@]})); do
  alive=()
  for pid in "${heavy_pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
  heavy_pids=("${alive[@]}")
  pick=-1
  if (($(jobs -rp | wc -l) < jobs)); then
    for i in "${!queue[@]}"; do
      if ! is_heavy "${queue[i]%%$'\t'*}" || ((${#heavy_pids[@]} < heavy_jobs)); then
        pick=$i
        break
      fi
    done
  fi
  if ((pick < 0)); then
    wait -n || true
    continue
  fi
  IFS=$'\t' read -r binary name <<<"${queue[pick]}"
  queue=("${queue[@]:0:pick}" "${queue[@]:pick+1}")
  run_one "$binary" "$name" &
  is_heavy "$binary" && heavy_pids+=("$!")
done
wait

# Only passing runs order the next: a test that failed early would look short.
# Two runs may end at once (hack/e2e.sh runs node faults beside the others): one at a time here.
{
  flock 9
  awk -F'\t' '$3 == "ok"' "$run_times" | cut -f1,2 >>"$times"
  # Keep the file short: the latest runs are what orders the next.
  tail -n 2000 "$times" >"$times.tmp" && mv "$times.tmp" "$times"
} 9>"$times.lock"

echo "e2e-run: the slowest (seconds):"
# awk reads to the end: `head` would leave sort writing into a closed pipe, and
# under pipefail its SIGPIPE (141) fails a run whose tests all passed.
sort -t$'\t' -k1,1rn "$run_times" | cut -f1,2 | awk 'NR <= 10 { print "  " $0 }'
failed=$(awk -F'\t' '$3 == "FAILED"' "$run_times")
if [[ -n $failed ]]; then
  while IFS=$'\t' read -r _ name _ log; do
    echo "---- $name ($log) ----"
    cat "$log"
  done <<<"$failed"
  # Each with what it panicked on: the end of a long output (all CI keeps) says why too.
  echo "e2e-run: $(wc -l <<<"$failed") of $total failed:"
  while IFS=$'\t' read -r _ name _ log; do
    echo "  $name"
    grep -m1 -A2 'panicked at' "$log" | cut -c1-400 | sed 's/^/      /' || true
  done <<<"$failed"
  exit 1
fi
echo "e2e-run: all $total passed"
exit
}
