#!/usr/bin/env bash
# Generated upstream tests, run in clean environments WITHOUT maskfuzz.
#
#   scripts/clean_env_upstream_tests.sh OUTDIR
#
# For each row of ROWS below: `maskfuzz repro` (from the repo's own .venv) writes
# OUTDIR/tests/<target>-<id>-<pin>/test_<target>_<defect>.py; a fresh venv per framework version
# (OUTDIR/venvs/<pkg>-<ver>, outside the repo) gets torch 2.13.0 (CPU), pytest, the framework
# release with --no-deps and only the third-party packages its import chain needs; the test then
# runs from a directory outside the repo, at the pin and (where the ledger knows one) at the fix
# pin. Ends with a summary table. See docs/audit/upstream-tests.md for the results and why each
# dependency is there.
#
# Needs: python3.11 on PATH, PyPI reachable (the torch 2.13.0 CPU wheel comes from local disk via
# the machine's pip find-links), the repo venv at REPO/.venv with maskfuzz installed.
set -euo pipefail

OUT=${1:?usage: $0 OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3.11}
VENVS=$OUT/venvs
TESTS=$OUT/tests
RUNS=$OUT/runs
mkdir -p "$VENVS" "$TESTS" "$RUNS"

quiet() { { grep -v -E "Location|requires|resolver|^$" || true; }; }

# --- clean venvs: one per framework version -------------------------------------------------------
# name | pip install --no-deps <release> | third-party packages the module import chain needs
ENVS=(
  "verl-0.9.1|verl==0.9.1|numpy==2.2.6 ray==2.49.2 tensordict==0.10.0 omegaconf==2.3.0 transformers==5.10.4 codetiming==1.4.0"
  "verl-0.4.1|verl==0.4.1|numpy==1.26.4 pandas==2.2.3 ray==2.47.1 tensordict==0.6.2 omegaconf==2.3.0 transformers==4.53.3 setuptools<81"
  "verl-0.5.0|verl==0.5.0|numpy==1.26.4 pandas==2.3.3 ray==2.48.0 tensordict==0.9.1 omegaconf==2.3.0 transformers==4.55.4"
  "verl-0.1|verl==0.1|numpy==1.26.4 ray==2.40.0 tensordict==0.6.2 transformers==4.47.1"
  "openrlhf-0.3.6.post1|openrlhf==0.3.6.post1|numpy==1.26.4 transformers==4.42.4 ray==2.12.0 deepspeed==0.14.4 bitsandbytes==0.43.3 peft==0.12.0 datasets==2.21.0 pyarrow==16.1.0 loralib==0.1.2 tqdm"
  "skyrl-0.3.1|skyrl-train==0.3.1|numpy==2.2.6 ray==2.51.1 jaxtyping==0.3.11 loguru==0.7.3 omegaconf==2.3.0"
  "torchrl-0.14.1|torchrl==0.14.1|tensordict==0.14.3"
)

build_env() {
  local name=$1 pkg=$2 deps=$3 v=$VENVS/$1 extra=()
  if [[ -x $v/bin/python && -f $v/.complete ]]; then return; fi
  echo "--- venv $name" >&2
  rm -rf "$v"
  "$PY" -m venv "$v"
  "$v/bin/pip" install -q torch==2.13.0 pytest 2>&1 | quiet >&2
  # skyrl-train 0.3.1 declares Requires-Python ==3.12.*; the wheel is py3-none-any and the GAE
  # module runs on 3.11 (the torch CPU wheel on this machine is cp311 only)
  [[ $name == skyrl-* ]] && extra=(--ignore-requires-python)
  "$v/bin/pip" install -q --no-deps "${extra[@]}" "$pkg" 2>&1 | quiet >&2
  # deepspeed 0.14.4 is an sdist: build it without ops (pure Python, CPU accelerator)
  # shellcheck disable=SC2086
  DS_BUILD_OPS=0 "$v/bin/pip" install -q $deps 2>&1 | quiet >&2
  # the clean env must not see maskfuzz or its packages
  for m in maskfuzz fuzz oracles targets; do
    if (cd "$OUT" && "$v/bin/python" -c "import $m" 2>/dev/null); then
      echo "ERROR: $m importable in $v" >&2; exit 1
    fi
  done
  touch "$v/.complete"
}

for e in "${ENVS[@]}"; do IFS='|' read -r name pkg deps <<<"$e"; build_env "$name" "$pkg" "$deps"; done

# --- tests ---------------------------------------------------------------------------------------
# target[:entry] | corpus file | pin | venv at pin | fix pin venv ("-" = none known) | expected at pin
ROWS=(
  "verl|verl/reference-b53507026df5502d.json|0.9.1|verl-0.9.1|-|failed"
  "verl|verl/reference-a1406ab1912c899c.json|0.1|verl-0.1|verl-0.5.0|failed"
  "openrlhf|openrlhf/masked-zero-34ca51fe1b71880f.json|0.3.6.post1|openrlhf-0.3.6.post1|-|failed"
  "skyrl|skyrl/poison-dbee94a8364d80ce.json|0.3.1|skyrl-0.3.1|-|failed"
  "torchrl:vec|torchrl/no-crash-e18c61278ae9bbec.json|0.14.1|torchrl-0.14.1|-|failed"
)

# maskfuzz runs only here, from the repo venv
generate() {
  local target=$1 file=$2 pin=$3 dir=$4
  (
    cd "$REPO"
    # shellcheck disable=SC1091
    . .venv/bin/activate
    # shellcheck disable=SC1091
    [[ -f /tmp/repos.sh ]] && . /tmp/repos.sh
    maskfuzz repro "corpus/$file" --target "$target@$pin" -o "$dir"
  ) >"$dir.gen.log" 2>&1
}

run_test() {  # venv test-file log -> the pytest summary line
  local v=$VENVS/$1 test=$2 log=$3 wd
  wd=$(mktemp -d "$RUNS/wd.XXXXXX")  # outside the repo, holds only the test
  cp "$test" "$wd/"
  (cd "$wd" && "$v/bin/python" -m pytest -q -p no:cacheprovider -W ignore "$(basename "$test")") >"$log" 2>&1 || true
  { grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)|[0-9]+ error" "$log" || echo "(no summary: see $log)"; } | tail -1
}

TABLE=$OUT/summary.tsv
printf "target\tentry\tpin\tresult at pin\tfix pin\tresult at fix pin\tnote\n" >"$TABLE"
for r in "${ROWS[@]}"; do
  IFS='|' read -r target file pin env fixenv expect <<<"$r"
  t=${target%%:*}
  id=${file##*-}; id=${id%.json}
  dir=$TESTS/$t-$id-$pin
  mkdir -p "$dir"
  rc=0; generate "$target" "$file" "$pin" "$dir" || rc=$?
  test_file=$(ls "$dir"/test_*.py 2>/dev/null | head -1 || true)
  if [[ -z $test_file ]]; then
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$target" "$id" "$pin" "no test (repro rc=$rc)" "-" "-" "see $dir.gen.log" >>"$TABLE"
    continue
  fi
  at=$(run_test "$env" "$test_file" "$RUNS/$t-$id-$pin.log")
  fix="-"; atfix="-"
  if [[ $fixenv != - ]]; then
    fix=${fixenv#*-}
    atfix=$(run_test "$fixenv" "$test_file" "$RUNS/$t-$id-$fix.log")
  fi
  note=""
  [[ $at == *"$expect"* ]] || note="UNEXPECTED: should have $expect at the pin"
  printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$target" "$id" "$pin" "$at" "$fix" "$atfix" "$note" >>"$TABLE"
done

echo
column -t -s $'\t' "$TABLE"
echo
echo "tests: $TESTS   pytest logs: $RUNS   venvs: $VENVS"
