#!/usr/bin/env bash
# make mutation: cosmic-ray over the rule-bearing modules (scripts/mutation.toml), in a copy of
# the tree under .tools/mutation/tree (cosmic-ray edits the module it mutates in place), with
# the copy first on PYTHONPATH so the tests import the mutated code. Resumable: an existing
# session is continued; MUTATION_FRESH=1 starts over. MUTATION_MODULES restricts the run to
# some of the modules (space-separated paths); MUTATION_TESTS replaces the test paths;
# MUTATION_WORK puts the copy and the session elsewhere (default .tools/mutation).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$root/.venv}
work=${MUTATION_WORK:-$root/.tools/mutation}
tree=$work/tree
session=$work/session.sqlite
mkdir -p "$work"
if [[ "${MUTATION_FRESH:-0}" == 1 || ! -f $session ]]; then
    rm -rf "$tree" "$session"
    mkdir -p "$tree"
    (cd "$root" && git ls-files -z --cached --others --exclude-standard | grep -z -E '^(cleaner|tests|scripts)/|^pyproject.toml$' \
        | xargs -0 cp --parents -t "$tree")
    # The compiled core is a build product git does not list: the copy imports the same one.
    cp "$root"/cleaner/_native*.so "$tree/cleaner/"
    config=$tree/scripts/mutation.toml
    if [[ -n "${MUTATION_MODULES:-}" ]]; then
        python3 - "$config" $MUTATION_MODULES <<'PY'
import re, sys
path, modules = sys.argv[1], sys.argv[2:]
text = open(path).read()
listed = "module-path = [\n" + "".join(f'    "{m}",\n' for m in modules) + "]"
open(path, "w").write(re.sub(r"module-path = \[.*?\]", listed, text, count=1, flags=re.S))
PY
    fi
    if [[ -n "${MUTATION_TESTS:-}" ]]; then
        python3 - "$config" "$MUTATION_TESTS" <<'PY'
import re, sys
path, tests = sys.argv[1], sys.argv[2]
text = open(path).read()
open(path, "w").write(re.sub(r"(-m 'not slow') [^\"]*\"", lambda m: f'{m.group(1)} {tests}"', text, count=1))
PY
    fi
    (cd "$tree" && "$venv/bin/cosmic-ray" init scripts/mutation.toml "$session" \
        && "$venv/bin/cr-filter-operators" "$session" scripts/mutation.toml)
    rm -rf "$work/pristine" && cp -r "$tree/cleaner" "$work/pristine"
fi
# A run stopped mid-mutant leaves that mutant in the copy: start from the pristine modules.
rm -rf "$tree/cleaner" && cp -r "$work/pristine" "$tree/cleaner"
cd "$tree"
export PYTHONPATH=$tree PYTHONSAFEPATH=1 PATH=$venv/bin:$PATH
# The unmutated tree must pass, or every mutant would count as killed.
"$venv/bin/cosmic-ray" baseline scripts/mutation.toml
nice "$venv/bin/cosmic-ray" exec scripts/mutation.toml "$session"
"$venv/bin/cr-report" --show-pending "$session" > "$work/report.txt" || true
"$venv/bin/python" "$root/scripts/mutation_scores.py" "$session" | tee "$work/scores.txt"
