#!/usr/bin/env python3
"""What Volcano has bound, read from `kubectl get pods -o json` output (for test.sh).

  pods.py bound <pods.json> <resource> <job>
      one line: "shares=N gang=M": the units of <resource> that the containers of bound pods
      (spec.nodeName set, not Succeeded or Failed) ask for, and how many pods of vcjob <job>
      (label volcano.sh/job-name) are bound. One list call, so one snapshot.
  pods.py scheduled-gap <pods.json> <job>
      seconds between the first and the last PodScheduled=True of <job>'s pods ("none" when
      not all of them are scheduled)
"""
import datetime
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def live_bound(pod):
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def of_job(pod, job):
    return ((pod.get("metadata") or {}).get("labels") or {}).get("volcano.sh/job-name") == job


def asked(pod, resource):
    n = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        v = (res.get("limits") or {}).get(resource) or (res.get("requests") or {}).get(resource)
        if v is not None:
            n += int(v)
    return n


def bound(pods, resource, job):
    items = [p for p in pods["items"] if live_bound(p)]
    shares = sum(asked(p, resource) for p in items)
    gang = sum(1 for p in items if of_job(p, job))
    return f"shares={shares} gang={gang}"


def scheduled_gap(pods, job):
    times = []
    for p in pods["items"]:
        if not of_job(p, job):
            continue
        t = None
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "True":
                t = datetime.datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00"))
        if t is None:
            return "none"
        times.append(t)
    if not times:
        return "none"
    return str(int((max(times) - min(times)).total_seconds()))


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "bound":
        print(bound(load(args[0]), args[1], args[2]))
    elif cmd == "scheduled-gap":
        print(scheduled_gap(load(args[0]), args[1]))
    else:
        raise SystemExit(f"pods.py: unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv)
