#!/bin/sh
# The nightly launcher, run by CronJob vakpipe-nightly in a kubectl image as
# ServiceAccount vakpipe-launcher (create/get/list/delete on daskjobs, nothing else):
#
#  1. refuses to start while a nightly DaskJob has not ended (exit 1);
#  2. creates tonight's DaskJob from the template, under a unique name;
#  3. waits until the operator marks it Successful or Failed, and exits 0 or 1 so the
#     CronJob's history (failedJobsHistoryLimit) shows the nights that failed;
#  4. deletes all but the newest $KEEP_DASKJOBS ended nightly DaskJobs (their runner
#     pods, which hold the logs, go with them).
#
# POSIX sh: the image may have busybox only.
set -eu

template=${DASKJOB_TEMPLATE:-/launcher/daskjob-nightly.yaml}
keep=${KEEP_DASKJOBS:-7}
poll=${POLL_SECONDS:-30}
placeholder=vakpipe-nightly-template
selector=app.kubernetes.io/name=vakpipe-nightly

log() {
    printf '%s launch-nightly: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2
}

# "name status" per nightly DaskJob, oldest first (status is empty until the operator
# has seen it).
nightly_jobs() {
    kubectl get daskjobs -l "$selector" --sort-by=.metadata.creationTimestamp \
        -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.jobStatus}{"\n"}{end}'
}

case $keep in
    '' | *[!0-9]* | 0) log "KEEP_DASKJOBS must be a whole number >= 1, not '$keep'"; exit 2 ;;
esac

running=$(nightly_jobs | awk '$2 != "Successful" && $2 != "Failed" { print $1 }')
if [ -n "$running" ]; then
    log "not starting: nightly DaskJob(s) still running: $(echo "$running" | tr '\n' ' ')"
    exit 1
fi

name="vakpipe-nightly-$(date -u +%Y%m%d-%H%M%S)"
sed "s/$placeholder/$name/g" "$template" | kubectl create -f -
log "created daskjob/$name"

while :; do
    status=$(kubectl get daskjob "$name" -o jsonpath='{.status.jobStatus}')
    case $status in
        Successful) outcome=0; break ;;
        Failed) outcome=1; break ;;
    esac
    sleep "$poll"
done
log "daskjob/$name: $status (logs: kubectl logs pod/$name-runner)"

ended=$(nightly_jobs | awk '$2 == "Successful" || $2 == "Failed" { print $1 }')
count=$(printf '%s\n' "$ended" | grep -c . || true)
printf '%s\n' "$ended" | awk -v drop=$((count - keep)) 'NR <= drop' | while read -r old; do
    kubectl delete daskjob "$old" --wait=false
    log "deleted daskjob/$old"
done

exit "$outcome"
