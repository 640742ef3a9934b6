#!/usr/bin/env bash
# `make sanitize`: the C kernel under AddressSanitizer and UndefinedBehaviorSanitizer
# (docs/audit.md, "Memory safety"). A copy of the project (the tree as it is, without
# its venv or built extension) gets the extension built instrumented; the venv's Python
# then runs, with the sanitizers' runtimes preloaded and Python's own allocator off (so
# that a read past an object's end is caught too), the tests of the kernel, the formats,
# the audit and the hostile and mutated files, then $1 seconds (default 300) of mutated
# archives audited and replayed. A memory error or undefined behaviour aborts with its
# report.
set -euo pipefail

# One function, read whole before it runs: the script may be edited while it runs.
main() {
    seconds=${1:-300}
    project=$(cd "$(dirname "$0")/.." && pwd)
    python=$project/.venv/bin/python
    cc=${CC:-gcc}
    asan=$("$cc" -print-file-name=libasan.so)
    ubsan=$("$cc" -print-file-name=libubsan.so)
    if [ ! -e "$asan" ] || [ ! -e "$ubsan" ]; then
        echo "sanitize: $cc has no libasan.so or libubsan.so here (install its sanitizer runtimes)" >&2
        exit 2
    fi
    copy=$(mktemp -d "${TMPDIR:-/tmp}/vakpipe-sanitize.XXXXXX")
    # Every report goes to a file (a test's subprocess or pytest's capture would swallow its
    # stderr), shown when the script ends.
    reports=$copy/sanitizer-reports
    trap 'status=$?; cat "$reports"/* >&2 2>/dev/null || true; rm -rf "$copy"; exit $status' EXIT
    tar -C "$project" --exclude=./.venv --exclude=./.git --exclude='*.so' --exclude=./build \
        --exclude=.hypothesis --exclude=__pycache__ -cf - . | tar -C "$copy" -xf -
    cd "$copy"
    CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1" \
    LDFLAGS="-fsanitize=address,undefined" \
        "$python" setup.py -q build_ext --inplace --force > sanitize-build.log 2>&1 \
        || { cat sanitize-build.log >&2; exit 1; }
    export LD_PRELOAD="$asan:$ubsan" PYTHONMALLOC=malloc
    mkdir "$reports"
    export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:log_path=$reports/asan
    export UBSAN_OPTIONS=print_stacktrace=1:log_path=$reports/ubsan
    # The copy's package and its instrumented kernel, not the project's (the extension is
    # optional to setup.py: a build that failed shows here, with its log).
    "$python" -c "import sys, pipeline.ledger._ckernel as c; assert c.__file__.startswith(sys.argv[1]), c.__file__" "$copy" \
        || { cat sanitize-build.log >&2; exit 1; }
    # Not the slow tests: they start clusters and servers, or measure a process's peak
    # memory, which the sanitizers' shadow memory and quarantine make meaningless.
    "$python" -m pytest -q -p no:cacheprovider -m "not slow" tests/unit/ledger tests/unit/formats \
        tests/unit/audit tests/reliability/test_hostile_lines.py \
        tests/reliability/test_mutated_archives.py
    "$python" -m tests.helpers.mutants --seconds "$seconds"
    echo "sanitize: no memory error or undefined behaviour found"
}

main "$@"
