#!/usr/bin/env python3
"""Convert a public GPU-cluster trace into the trace CSV of `dualpipe cluster simulate`.

    python3 scripts/public_trace.py philly cluster_job_log --output trace.csv
    python3 scripts/public_trace.py helios cluster_log.csv --output trace.csv
    python3 scripts/public_trace.py pai pai_job_table.csv pai_task_table.csv --output trace.csv
    python3 scripts/public_trace.py slice Philly/training_data/philly_data_training.csv --output trace.csv
    python3 scripts/public_trace.py slice philly_data_training.csv --elastic 2 --output elastic.csv

Formats (none of these traces is committed here; fetch them from their publishers):

- `philly`: Microsoft's Philly trace (msr-fiddle/philly-traces), `cluster_job_log`, a JSON list
  of jobs. Arrival: `submitted_time`. Devices: the GPUs of the job's last scheduling attempt
  (summed over its machines). Run time: the sum of its attempts' `end_time - start_time` (the
  time it actually held GPUs); an attempt whose start or end the log does not have (null,
  `"None"` or `""`: one still running when the log was collected) is left out.
- `helios`: SenseTime's Helios traces (S-Lab-System-Group/HeliosData), a cluster's
  `cluster_log.csv`. Arrival: `submit_time`; devices: `gpu_num`; run time: `duration` (end
  minus start, in seconds). Jobs with `gpu_num` 0 (CPU jobs) are dropped.
- `pai`: Alibaba's PAI trace of 2020 (alibaba/clusterdata, cluster-trace-gpu-v2020), the
  header-less `pai_job_table.csv` and `pai_task_table.csv`. Arrival: the job's `start_time`
  (its submission); devices: the sum over its tasks of `inst_num x plan_gpu / 100`, rounded up
  (a task asking 50% of a GPU counts half a device, so small tasks share one); run time: the
  job's `end_time` minus its earliest task's `start_time`. A time of 0, or none, is no time
  (Alibaba's analysis of the trace reads 0 so): such a task does not start its job, and a job
  without a start or end never ran.
- `slice`: the last 15,000 jobs of Philly and of Helios as DIR-LAB/Gen-Parallel-Workloads
  publishes them (`Philly/training_data/philly_data_training.csv`,
  `Helios/training_data/helios_data_training.csv`; JSSPP 2024), one header row
  `u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status`. Arrival: the sum
  of the `interval`s so far (each is the seconds since the previous submission); devices:
  `gpu_num` (0, a CPU job, is dropped); run time: `run_time`; completed: `new_status` Pass.

In every format a job that never ran (no start or end time, no GPUs, a run time of 0) is
dropped, and with `--devices N` so is a job asking more than N devices (the simulator refuses
those); jobs that ran and then failed or were killed are kept by default (they held devices),
`--completed-only` drops them. Arrivals start at 0 (the first kept job) and rows are sorted by
arrival. Every job is rigid (`min_gpus`, `max_gpus` empty): these traces say nothing about
elasticity. `--elastic F` asks what if they were (Pollux's evaluation makes every job of its
trace adaptive): every job may run on `ceil(gpus / F)` to `F x gpus` devices (at most
`--devices`), the range `dualpipe cluster trace` gives its elastic jobs at F = 2.

On stderr: how many jobs were read, kept and dropped (by reason), and the offered load on
`--devices` devices (requested device-seconds over devices x the arrival window), the figure
that decides whether a cluster queues (docs/cluster.md), and, for rigid jobs, the utilisation
bound: the most any schedule of these jobs can reach on those devices, since none ends before a
job's arrival plus its run time, nor before an arrival plus the work arriving from then on over
the devices (a trace cut from a running cluster ends with a drain).

Bad input (a missing file, a malformed row or time) is one line on stderr and exit code 2.
"""

import argparse
import csv
import json
import math
import os
import sys
from datetime import datetime, timezone


class TraceError(Exception):
    """Bad input: printed as one line, exit code 2."""


def seconds(text, where):
    """`YYYY-MM-DD HH:MM:SS` as seconds: the traces' clock read as it is written (only
    differences matter), whatever this machine's time zone and its daylight saving."""
    try:
        when = datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S")
        return when.replace(tzinfo=timezone.utc).timestamp()
    except (ValueError, AttributeError):
        raise TraceError(f"{where}: time {text!r} is not YYYY-MM-DD HH:MM:SS") from None


def number(text, where, field):
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {field} = {text!r} is not a number") from None
    if not math.isfinite(value):
        raise TraceError(f"{where}: {field} = {text!r} is not finite")
    return value


# How Philly's log writes a time it does not have (an attempt still running when the log was
# collected has no end time): null, "None" or "".
PHILLY_NO_TIME = (None, "None", "")


def philly(paths, completed_only):
    """Jobs `(name, arrival, gpus, duration, dropped_reason)` of Philly's `cluster_job_log`."""
    try:
        with open(paths[0]) as f:
            jobs = json.load(f)
    except json.JSONDecodeError as e:
        raise TraceError(f"{paths[0]}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(jobs, list):
        raise TraceError(f"{paths[0]}: expected a JSON list of jobs")
    for i, job in enumerate(jobs):
        where = f"{paths[0]}: job {i}"
        if not isinstance(job, dict) or "jobid" not in job:
            raise TraceError(f"{where}: expected an object with jobid, submitted_time and attempts")
        name = str(job["jobid"])
        if completed_only and job.get("status") != "Pass":
            yield name, None, 0, 0.0, "not completed"
            continue
        attempts = [a for a in job.get("attempts") or []
                    if a.get("start_time") not in PHILLY_NO_TIME
                    and a.get("end_time") not in PHILLY_NO_TIME]
        if not attempts or job.get("submitted_time") in PHILLY_NO_TIME:
            yield name, None, 0, 0.0, "never ran"
            continue
        arrival = seconds(job["submitted_time"], f"{where} ({name}) submitted_time")
        gpus = sum(len(d.get("gpus") or []) for d in attempts[-1].get("detail") or [])
        duration = sum(seconds(a["end_time"], f"{where} ({name}) end_time")
                       - seconds(a["start_time"], f"{where} ({name}) start_time") for a in attempts)
        yield name, arrival, gpus, duration, None


def csv_rows(path, need):
    """`(where, row)` for each row of a CSV file with a header naming at least `need`."""
    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        if rows.fieldnames is None or not need <= set(rows.fieldnames):
            raise TraceError(f"{path}: expected a header with {', '.join(sorted(need))}")
        for line, row in enumerate(rows, start=2):
            yield f"{path}: line {line}", row


def gpu_request(row, where, dropped_as_not_completed):
    """A CSV job's `gpu_num` and None, or 0 and why the job is dropped."""
    if dropped_as_not_completed:
        return 0, "not completed"
    gpus = number(row["gpu_num"], where, "gpu_num")
    return (int(gpus), None) if gpus != 0 else (0, "no GPUs")


def helios(paths, completed_only):
    """Jobs of a Helios `cluster_log.csv`."""
    for where, row in csv_rows(paths[0], {"job_id", "gpu_num", "state", "submit_time", "duration"}):
        name = row["job_id"]
        gpus, reason = gpu_request(row, where, completed_only and row["state"] != "COMPLETED")
        if reason is not None:
            yield name, None, 0, 0.0, reason
            continue
        if not row["duration"] or not row["submit_time"]:
            yield name, None, 0, 0.0, "never ran"
            continue
        yield (name, seconds(row["submit_time"], f"{where} submit_time"), gpus,
               number(row["duration"], where, "duration"), None)


def pai_time(text, where, field):
    """A PAI time in seconds, or None where the trace has none: empty, or 0 (as Alibaba's own
    analysis of the trace reads it)."""
    if not text:
        return None
    value = number(text, where, field)
    return value if value != 0 else None


def pai(paths, completed_only):
    """Jobs of PAI's `pai_job_table.csv` and `pai_task_table.csv` (no header rows)."""
    if len(paths) != 2:
        raise TraceError("pai: give pai_job_table.csv and pai_task_table.csv")
    devices, first_start = {}, {}
    with open(paths[1], newline="") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            where = f"{paths[1]}: line {line}"
            if len(row) < 9:
                raise TraceError(f"{where}: {len(row)} columns; expected job_name,task_name,inst_num,"
                                 "status,start_time,end_time,plan_cpu,plan_mem,plan_gpu[,gpu_type]")
            job = row[0]
            inst = number(row[2] or "0", where, "inst_num")
            plan_gpu = number(row[8] or "0", where, "plan_gpu")
            devices[job] = devices.get(job, 0.0) + inst * plan_gpu / 100.0
            start = pai_time(row[4], where, "start_time")
            if start is not None:
                first_start[job] = min(first_start.get(job, start), start)
    with open(paths[0], newline="") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            where = f"{paths[0]}: line {line}"
            if len(row) < 6:
                raise TraceError(f"{where}: {len(row)} columns; expected job_name,inst_id,user,status,"
                                 "start_time,end_time")
            name = row[0]
            if completed_only and row[3] != "Terminated":
                yield name, None, 0, 0.0, "not completed"
                continue
            gpus = math.ceil(devices.get(name, 0.0) - 1e-9)
            if gpus <= 0:
                yield name, None, 0, 0.0, "no GPUs"
                continue
            submitted = pai_time(row[4], where, "start_time")
            end = pai_time(row[5], where, "end_time")
            if submitted is None or end is None or name not in first_start:
                yield name, None, 0, 0.0, "never ran"
                continue
            yield name, submitted, gpus, end - first_start[name], None


def slice_(paths, completed_only):
    """Jobs of a Gen-Parallel-Workloads slice: arrivals as gaps from the previous submission."""
    arrival = 0.0
    for where, row in csv_rows(paths[0], {"u_id", "gpu_num", "interval", "run_time", "new_status"}):
        gap = number(row["interval"], where, "interval")
        if gap < 0:
            raise TraceError(f"{where}: interval = {row['interval']}: give the seconds since the "
                             "previous submission, 0 or more")
        arrival += gap
        name = f"job{row['u_id']}"
        gpus, reason = gpu_request(row, where, completed_only and row["new_status"] != "Pass")
        if reason is not None:
            yield name, None, 0, 0.0, reason
            continue
        yield name, arrival, gpus, number(row["run_time"], where, "run_time"), None


READERS = {"philly": philly, "helios": helios, "pai": pai, "slice": slice_}


def convert(fmt, paths, devices, completed_only):
    """The kept rows `(name, arrival_s, gpus, duration_s)` sorted by arrival, and the counts."""
    kept, dropped, read = [], {}, 0
    for name, arrival, gpus, duration, reason in READERS[fmt](paths, completed_only):
        read += 1
        if reason is None and (gpus <= 0 or duration <= 0):
            reason = "no GPUs" if gpus <= 0 else "ran for 0 s"
        if reason is None and devices and gpus > devices:
            reason = f"more than {devices} devices"
        if reason is not None:
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        kept.append((name, arrival, gpus, duration))
    if not kept:
        raise TraceError(f"{fmt}: none of the {read} jobs ran on GPUs; nothing to write")
    kept.sort(key=lambda r: (r[1], r[0]))
    t0 = kept[0][1]
    rows = [(name, arrival - t0, gpus, duration) for name, arrival, gpus, duration in kept]
    return rows, read, dropped


def requested_work(rows):
    """The rows' requested device-seconds: each job's devices x run time."""
    return sum(g * d for _, _, g, d in rows)


def offered_load(rows, devices):
    window = rows[-1][1] - rows[0][1]
    if window <= 0:
        return float("nan")
    return requested_work(rows) / (devices * window)


def utilization_bound(rows, devices):
    """The highest whole-run utilisation (busy device-seconds over devices x makespan) that any
    schedule running each job rigid, at its run time, can reach, and the earliest end (hours)
    behind it. No schedule ends before any job's arrival plus its run time, nor before any
    arrival time plus the work arriving from then on over the devices (work cannot start before
    it arrives). `rows` are sorted by arrival."""
    work = requested_work(rows)
    end = max(a + d for _, a, _, d in rows)
    later = work
    for _, arrival, gpus, duration in rows:
        end = max(end, arrival + later / devices)
        later -= gpus * duration
    return work / (devices * end), end / 3600


def elastic_range(gpus, factor, devices):
    """`(min_gpus, max_gpus)` of a job asking `gpus` when every job may shrink to a `factor`-th
    of its request and grow to `factor` times it (at most `devices`, when not 0)."""
    most = factor * gpus
    if devices:
        most = min(most, devices)
    return -(-gpus // factor), most


def write(rows, out, factor=None, devices=0):
    out.write("job,arrival_s,gpus,duration_s,min_gpus,max_gpus,profile\n")
    for name, arrival, gpus, duration in rows:
        span = ",".join(map(str, elastic_range(gpus, factor, devices))) if factor else ","
        # The simulator's CSV has no quoting: a comma inside a name becomes "_".
        out.write(f"{name.replace(',', '_')},{arrival:.3f},{gpus},{duration:.3f},{span},\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("format", choices=sorted(READERS))
    ap.add_argument("files", nargs="+", help="the trace's file(s), as the format says")
    ap.add_argument("--output", "-o", help="the trace CSV to write (default: stdout)")
    ap.add_argument("--devices", type=int, default=512,
                    help="the simulated cluster's devices: the offered load is reported on them and "
                         "jobs asking more are dropped (default 512, testdata/cluster/64x8.json); 0 keeps all")
    ap.add_argument("--completed-only", action="store_true",
                    help="drop jobs that failed or were killed (kept by default: they held devices)")
    ap.add_argument("--elastic", type=int, metavar="F",
                    help="make every job elastic: from ceil(gpus / F) to F x gpus devices (F at least 2; "
                         "default: every job rigid, as the trace says)")
    args = ap.parse_args(argv)
    if args.devices < 0:
        print(f"error: --devices {args.devices}: give 0 or more", file=sys.stderr)
        return 2
    if args.elastic is not None and args.elastic < 2:
        print(f"error: --elastic {args.elastic}: give 2 or more (leave it out for rigid jobs)", file=sys.stderr)
        return 2
    try:
        rows, read, dropped = convert(args.format, args.files, args.devices, args.completed_only)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    if args.output:
        tmp = args.output + ".part"
        with open(tmp, "w") as f:
            write(rows, f, args.elastic, args.devices)
        os.replace(tmp, args.output)
    else:
        write(rows, sys.stdout, args.elastic, args.devices)
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(dropped.items())) or "none"
    print(f"{args.format}: {read} jobs read, {len(rows)} kept, dropped: {why}", file=sys.stderr)
    if args.devices:
        window_h = (rows[-1][1] - rows[0][1]) / 3600
        print(f"offered load on {args.devices} devices: {offered_load(rows, args.devices):.3f} "
              f"(arrival window {window_h:.1f} h)", file=sys.stderr)
        bound, end_h = utilization_bound(rows, args.devices)
        if args.elastic:
            print(f"every job elastic from ceil(gpus / {args.elastic}) to {args.elastic} x gpus devices: "
                  f"no utilisation bound (the rigid jobs' {100 * bound:.1f}% does not hold when jobs grow)",
                  file=sys.stderr)
        else:
            print(f"utilisation bound on {args.devices} devices: {100 * bound:.1f}% (every job rigid at "
                  f"its run time: no schedule ends before {end_h:.1f} h)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
