#!/usr/bin/env bash
# Names the dependencies that `make test`'s builds compile more than once because cargo resolved
# their features differently per invocation (the binaries, the unit tests, the end-to-end tests,
# hack/e2e.sh's node faults alone).
# Each one named goes into crates/workspace-hack/Cargo.toml with the features it lacks.
# It builds what those invocations build (no more), so on a built tree it takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

# artifacts <cargo args...>: "name hash" of each non-workspace library an invocation builds.
artifacts() {
  cargo "$@" --quiet --message-format=json | python3 -c '
import json, re, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and "path+file" not in m["package_id"]:
        for f in m["filenames"]:
            found = re.match(r"lib(.*)-([0-9a-f]+)\.rlib$", f.rsplit("/", 1)[-1])
            if found:
                print(found.group(1), found.group(2))
'
}

# Drift: a later invocation builds a library an earlier one built, under a hash none of them
# used (one build per feature set). A dev-dependency the binaries never build is not drift.
drift=$(
  { artifacts build --workspace --bins | sed 's/^/bins /'
    artifacts test --workspace --lib --bins --no-run | sed 's/^/unit /'
    artifacts test -p noops-e2e -p noops-sample-operator --test '*' --no-run | sed 's/^/e2e /'
    artifacts test -p noops-e2e --test node_faults --no-run | sed 's/^/faults /'
  } | python3 -c '
import sys
# Built in the unit tests for the build script of promql-parser (a dev-dependency) on the host,
# where the binaries build them for the target: a second build no feature can merge (a host
# profile). Only there: built again anywhere else, they are drift like any other.
host_only = {"filetime", "prettyplease", "syn", "time", "unicode_width"}
seen = {}
for line in sys.stdin:
    invocation, name, digest = line.split()
    earlier = seen.setdefault(name, {})
    if name in host_only and invocation == "unit":
        continue
    if earlier and digest not in earlier and invocation not in earlier.values():
        print(name, "(" + invocation + ")")
    earlier.setdefault(digest, invocation)
' | sort -u
)
if [ -n "$drift" ]; then
  echo "built more than once, with different features (add them to crates/workspace-hack):"
  echo "$drift" | sed 's/^/  /'
  exit 1
fi
echo "no feature drift: every dependency is built once for the binaries and the tests"
