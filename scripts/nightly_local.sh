#!/usr/bin/env bash
# The nightly job (.github/workflows/nightly.yml) as local commands; see docs/nightly.md.
#
#   scripts/nightly_local.sh [options] [TARGET[:ENTRY]@PIN ...] [-- MORE FUZZ OPTIONS]
#
# Steps, each a plain maskfuzz command (printed before it runs):
#   1. fuzz the targets (default: the default release pins) with the nightly profile,
#      writing fuzz.json, fuzz.xml (JUnit) and new findings into a corpus
#   2. replay that corpus (every entry at its recorded and ledger pins) into replay.json
#   3. write reproducers for the new corpus entries, when `maskfuzz repro` exists
#   4. maskfuzz report against the previous local night (the newest earlier run under OUT), bisecting
#      each finding new or fixed tonight at a pin that moved since then (@main, @latest, a callable's
#      @HEAD) between the two nights' revisions: the report names the commit or release
#
# Options:
#   -o, --out DIR         where runs go (default: nightly-out); each run is DIR/<UTC time>
#   -j, --jobs N          fuzz N targets in parallel processes (default 1)
#   --budget SECONDS      seconds of fuzzing for the whole run, split evenly across its entries
#                         (default: the nightly profile's 1200)
#   --max-examples N      examples per target (default: the nightly profile's 100000)
#   --seed N              (default: today's date, YYYYMMDD, as in CI)
#   --profile NAME        (default: nightly)
#   --corpus DIR          record findings into DIR and replay it (default: a copy of the
#                         repository's corpus/ inside the run, so the checkout stays clean)
#   --previous FILE       the previous report.json (default: the newest under OUT)
#   --no-replay           skip step 2
#   --no-repro            skip step 3 (a reproducer runs its script on the pin: seconds each)
#   --no-bisect           do not bisect new / fixed findings in step 4
#   --bisect-timeout S    seconds one bisection may take (default 1800)
#   -h, --help
#
# The exit status is 0 when the report was written (findings are the output, not an error),
# 2 when a step could not produce its results.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=nightly-out
JOBS=1
BUDGET=""
MAX_EXAMPLES=""
SEED=$(date -u +%Y%m%d)
PROFILE=nightly
CORPUS=""
PREVIOUS=""
REPLAY=1
REPRO=1
BISECT=1
BISECT_TIMEOUT=1800
TARGETS=()
EXTRA=()

need() { [ $# -ge 2 ] && [ -n "$2" ] || { echo "nightly_local.sh: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    -o|--out) need "$@"; OUT=$2; shift 2 ;;
    -j|--jobs) need "$@"; JOBS=$2; shift 2 ;;
    --budget) need "$@"; BUDGET=$2; shift 2 ;;
    --max-examples) need "$@"; MAX_EXAMPLES=$2; shift 2 ;;
    --seed) need "$@"; SEED=$2; shift 2 ;;
    --profile) need "$@"; PROFILE=$2; shift 2 ;;
    --corpus) need "$@"; CORPUS=$2; shift 2 ;;
    --previous) need "$@"; PREVIOUS=$2; shift 2 ;;
    --no-replay) REPLAY=0; shift ;;
    --no-repro) REPRO=0; shift ;;
    --no-bisect) BISECT=0; shift ;;
    --bisect-timeout) need "$@"; BISECT_TIMEOUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    -*) echo "nightly_local.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
for n in "$JOBS" ${MAX_EXAMPLES:+"$MAX_EXAMPLES"} "$SEED" "$BISECT_TIMEOUT"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "nightly_local.sh: expected a whole number, got '$n'" >&2; exit 2; }
done
command -v maskfuzz > /dev/null || { echo "nightly_local.sh: maskfuzz is not on PATH (pip install -e .)" >&2; exit 2; }

RUN="$OUT/$(date -u +%Y%m%dT%H%M%SZ)"
while [ -e "$RUN" ]; do RUN="$RUN-1"; done
mkdir -p "$RUN/out" "$RUN/repro"
if [ -z "$PREVIOUS" ]; then
  PREVIOUS=$(find "$OUT" -mindepth 3 -maxdepth 3 -path '*/report/report.json' ! -path "$RUN/*" 2>/dev/null | sort | tail -n 1)
fi
if [ -z "$CORPUS" ]; then
  CORPUS="$RUN/corpus"
  mkdir -p "$CORPUS"
  if [ -d "$REPO/corpus" ]; then cp -r "$REPO/corpus/." "$CORPUS/"; fi
fi
mkdir -p "$CORPUS"
# carry the previous night's open findings (copied next to its report) so the replay re-checks them
if [ -n "$PREVIOUS" ] && [ -d "$(dirname "$PREVIOUS")/corpus" ]; then
  cp -r "$(dirname "$PREVIOUS")/corpus/." "$CORPUS/"
fi
list_corpus() { find "$CORPUS" -name '*.json' ! -name ledger.json | sort; }
list_corpus > "$RUN/out/corpus-before.txt"

step() { echo; echo "+ $*" >&2; }

echo "nightly run: $RUN (seed $SEED, jobs $JOBS, corpus $CORPUS, previous: ${PREVIOUS:-none})"

# 1. fuzz
FUZZ=(maskfuzz fuzz "${TARGETS[@]}" --profile "$PROFILE" --seed "$SEED" --jobs "$JOBS"
      --json "$RUN/out/fuzz.json" --junit "$RUN/out/fuzz.xml" --corpus "$CORPUS")
[ -n "$BUDGET" ] && FUZZ+=(--budget "$BUDGET")
[ -n "$MAX_EXAMPLES" ] && FUZZ+=(--max-examples "$MAX_EXAMPLES")
FUZZ+=(${EXTRA[@]+"${EXTRA[@]}"})
step "${FUZZ[@]}"
t0=$SECONDS
set +e
"${FUZZ[@]}" > "$RUN/out/fuzz.txt" 2> "$RUN/out/fuzz.log"
rc=$?
set -e
cat "$RUN/out/fuzz.txt"
echo "maskfuzz fuzz exited $rc in $((SECONDS - t0)) s (0 clean, 1 findings, 2 a target could not be set up)"
if [ ! -f "$RUN/out/fuzz.json" ]; then
  echo "nightly_local.sh: maskfuzz fuzz wrote no results; see $RUN/out/fuzz.log" >&2
  tail -n 20 "$RUN/out/fuzz.log" >&2
  exit 2
fi
RESULTS=("$RUN/out/fuzz.json")

# 2. replay the corpus
if [ "$REPLAY" = 1 ]; then
  step maskfuzz replay "$CORPUS" --json "$RUN/out/replay.json"
  set +e
  maskfuzz replay "$CORPUS" --json "$RUN/out/replay.json" > "$RUN/out/replay.txt" 2> "$RUN/out/replay.log"
  rc=$?
  set -e
  tail -n 15 "$RUN/out/replay.txt"
  echo "maskfuzz replay exited $rc (1: an entry fails unexpectedly, e.g. tonight's new findings)"
  if [ -f "$RUN/out/replay.json" ]; then RESULTS+=("$RUN/out/replay.json"); fi
fi

# 3. reproducers for the new findings
list_corpus > "$RUN/out/corpus-after.txt"
comm -13 "$RUN/out/corpus-before.txt" "$RUN/out/corpus-after.txt" > "$RUN/out/new-corpus-files.txt"
echo "$(wc -l < "$RUN/out/new-corpus-files.txt") new corpus entr(y/ies): $RUN/out/new-corpus-files.txt"
if [ "$REPRO" = 0 ]; then
  echo "(--no-repro: no reproducers)"
elif maskfuzz repro --help > /dev/null 2>&1; then
  # a --callable's entries (corpus/<module>/...) are reproduced on that callable, from its --source
  declare -A CALLABLE=()
  SOURCE=""
  for ((i = 0; i < ${#EXTRA[@]}; i++)); do
    case "${EXTRA[$i]}" in
      --callable) c=${EXTRA[$((i + 1))]:-}; c=${c%%@*}; m=${c%%:*}; CALLABLE[${m%%.*}]=$c ;;
      --source) SOURCE=${EXTRA[$((i + 1))]:-} ;;
    esac
  done
  made=0
  while read -r f; do
    id=$(basename "$f" .json); id=${id##*-}
    owner=$(basename "$(dirname "$f")")
    REPRO_ARGS=()
    if [ -n "${CALLABLE[$owner]:-}" ]; then
      REPRO_ARGS=(--callable "${CALLABLE[$owner]}")
      [ -n "$SOURCE" ] && REPRO_ARGS+=(--source "$SOURCE")
    fi
    step maskfuzz repro "$f" ${REPRO_ARGS[@]+"${REPRO_ARGS[@]}"} -o "$RUN/repro/$id"
    rc=0
    maskfuzz repro "$f" ${REPRO_ARGS[@]+"${REPRO_ARGS[@]}"} -o "$RUN/repro/$id" > /dev/null 2>> "$RUN/out/repro.log" || rc=$?
    case $rc in
      0) made=$((made + 1)) ;;
      1) made=$((made + 1)); echo "  written, but the case does not fail at its pin (see the reproducer)" ;;
      *) echo "  no reproducer (see $RUN/out/repro.log)" ;;
    esac
  done < "$RUN/out/new-corpus-files.txt"
  echo "$made reproducer(s) in $RUN/repro"
else
  echo "(no 'maskfuzz repro' command in this version: no reproducers)"
fi

# 4. report
REPORT=(maskfuzz report "${RESULTS[@]}" -o "$RUN/report" --corpus "$CORPUS" --repro-dir "$RUN/repro" --quiet)
[ -n "$PREVIOUS" ] && REPORT+=(--previous "$PREVIOUS")
[ "$BISECT" = 1 ] && [ -n "$PREVIOUS" ] && REPORT+=(--bisect --bisect-timeout "$BISECT_TIMEOUT")
step "${REPORT[@]}"
"${REPORT[@]}"
echo
echo "report: $RUN/report/report.md  $RUN/report/report.html  (next run compares against $RUN/report/report.json)"
