"""scripts/public_trace.py: public cluster traces (Philly, Helios, PAI, slices) into the simulator's CSV.

Each format is checked on a small file written here in that format's schema (no public trace is
committed): which jobs are kept, their arrivals, devices and run times, the report on stderr,
and bad input (one line, exit code 2). Where a built `dualpipe` CLI is found, the converted
trace is simulated too.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, dualpipe_cli

SCRIPT = REPO_ROOT / "scripts" / "public_trace.py"


def convert(*args, tz=None):
    env = dict(os.environ, TZ=tz) if tz else None
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True, timeout=60, env=env)


def rows(text):
    return list(csv.DictReader(text.splitlines()))


def attempt(start, end, gpus_per_machine):
    return {"start_time": start, "end_time": end,
            "detail": [{"ip": f"m{i}", "gpus": [f"gpu{g}" for g in range(n)]}
                       for i, n in enumerate(gpus_per_machine)]}


PHILLY = [
    {"status": "Pass", "vc": "v1", "jobid": "app_2", "user": "u",
     "submitted_time": "2017-10-07 01:11:39",
     # Two attempts: 74 s on 8 GPUs, then 1 h on 2 x 8 (the last attempt's GPUs count).
     "attempts": [attempt("2017-10-07 01:12:09", "2017-10-07 01:13:23", [8]),
                  attempt("2017-10-07 01:13:30", "2017-10-07 02:13:30", [8, 8])]},
    {"status": "Killed", "vc": "v1", "jobid": "app_1", "user": "u",
     "submitted_time": "2017-10-07 01:10:00",
     "attempts": [attempt("2017-10-07 01:10:05", "2017-10-07 01:20:05", [1])]},
    {"status": "Failed", "vc": "v2", "jobid": "app_3", "user": "u",
     "submitted_time": "2017-10-07 01:30:00", "attempts": []},
    {"status": "Pass", "vc": "v2", "jobid": "app_4", "user": "u",
     "submitted_time": "2017-10-07 01:40:00",
     "attempts": [attempt("2017-10-07 01:40:00", "2017-10-07 01:50:00", [8, 8, 8, 8])]},
    # Still running when the log was collected: its attempt has an empty end time.
    {"status": "Running", "vc": "v2", "jobid": "app_5", "user": "u",
     "submitted_time": "2017-10-07 01:45:00",
     "attempts": [attempt("2017-10-07 01:45:00", "", [1])]},
    # Its first attempt ended; the second has no start or end ("None"): the first counts.
    {"status": "Failed", "vc": "v2", "jobid": "app_6", "user": "u",
     "submitted_time": "2017-10-07 01:50:00",
     "attempts": [attempt("2017-10-07 01:50:00", "2017-10-07 01:51:40", [2]),
                  attempt("None", "None", [4])]},
]


def test_philly(tmp_path):
    src = tmp_path / "cluster_job_log"
    src.write_text(json.dumps(PHILLY))
    out = tmp_path / "trace.csv"
    p = convert("philly", src, "--output", out, "--devices", 16)
    assert p.returncode == 0, p.stderr
    got = rows(out.read_text())
    # Sorted by arrival from 0; app_3 never ran, app_4 asks 32 > 16 devices.
    assert [(r["job"], r["arrival_s"], r["gpus"], r["duration_s"]) for r in got] == [
        ("app_1", "0.000", "1", "600.000"),
        ("app_2", "99.000", "16", "3674.000"),
        ("app_6", "2400.000", "2", "100.000"),
    ]
    assert all(r["min_gpus"] == "" and r["max_gpus"] == "" for r in got)
    assert "6 jobs read, 3 kept, dropped: 1 more than 16 devices, 2 never ran" in p.stderr
    # (1 x 600 + 16 x 3674 + 2 x 100) device-seconds over 16 devices x 2400 s.
    assert f"offered load on 16 devices: {(600 + 16 * 3674 + 200) / (16 * 2400):.3f}" in p.stderr
    p = convert("philly", src, "--completed-only", "--devices", 0)
    assert p.returncode == 0, p.stderr
    assert [r["job"] for r in rows(p.stdout)] == ["app_2", "app_4"]
    assert "4 not completed" in p.stderr


def test_times_do_not_depend_on_the_machines_time_zone(tmp_path):
    # A run over the night New York's clocks went back (2017-11-05 02:00 EDT -> 01:00 EST):
    # read as written, 01:30 to 03:30 is 2 h wherever the conversion runs.
    job = {"status": "Pass", "vc": "v", "jobid": "app_dst", "user": "u",
           "submitted_time": "2017-11-05 01:00:00",
           "attempts": [attempt("2017-11-05 01:30:00", "2017-11-05 03:30:00", [1])]}
    src = tmp_path / "cluster_job_log"
    src.write_text(json.dumps(PHILLY[:1] + [job]))
    outputs = []
    for tz in ("UTC", "America/New_York", "Asia/Shanghai"):
        p = convert("philly", src, tz=tz)
        assert p.returncode == 0, p.stderr
        outputs.append(p.stdout)
        assert {r["job"]: r["duration_s"] for r in rows(p.stdout)}["app_dst"] == "7200.000", tz
    assert outputs[0] == outputs[1] == outputs[2]


def test_helios(tmp_path):
    src = tmp_path / "cluster_log.csv"
    src.write_text(
        "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
        "1425511,uX,vcJ,1,1,1,COMPLETED,2020-06-09 18:41:01,2020-06-09 18:41:01,2020-06-10 04:55:09,36848,0\n"
        "\"14,25512\",uV,vch,4,16,1,FAILED,2020-06-09 18:41:27,2020-06-09 18:41:27,2020-06-09 18:45:36,249,0\n"
        "1425513,uz,vcp,0,1,1,COMPLETED,2020-06-09 18:41:28,2020-06-09 18:41:28,2020-06-17 14:15:21,675233,0\n"
        "1425514,uz,vcp,8,8,1,CANCELLED,2020-06-09 18:42:01,,,0,0\n")
    p = convert("helios", src)
    assert p.returncode == 0, p.stderr
    assert [(r["job"], r["arrival_s"], r["gpus"], r["duration_s"]) for r in rows(p.stdout)] == [
        ("1425511", "0.000", "1", "36848.000"),
        ("14_25512", "26.000", "4", "249.000"),  # quoted with a comma in the source
    ]
    assert "4 jobs read, 2 kept, dropped: 1 no GPUs, 1 ran for 0 s" in p.stderr


def test_pai(tmp_path):
    jobs = tmp_path / "pai_job_table.csv"
    tasks = tmp_path / "pai_task_table.csv"
    jobs.write_text("j1,i1,u,Terminated,1000.0,4600.0\n"
                    "j2,i2,u,Failed,1200.0,1300.0\n"
                    "j3,i3,u,Terminated,1500.0,1600.0\n"
                    "j4,i4,u,Waiting,1700.0,\n"
                    "j5,i5,u,Terminated,1800.0,2000.0\n"
                    "j6,i6,u,Running,1900.0,0.0\n")
    tasks.write_text(
        # j1: 2 x 50% + 1 x 100% = 2 devices, first task at 1010.
        "j1,worker,2.0,Terminated,1010.0,4600.0,600.0,29.0,50.0,T4\n"
        "j1,ps,1.0,Terminated,1020.0,4600.0,600.0,29.0,100.0,T4\n"
        # j2: 3 x 25% = 0.75: one device.
        "j2,worker,3.0,Failed,1250.0,1300.0,600.0,29.0,25.0,V100\n"
        # j3: CPU only.
        "j3,tensorflow,1.0,Terminated,1500.0,1600.0,600.0,29.0,,\n"
        "j4,worker,1.0,Waiting,,,600.0,29.0,100.0,\n"
        # j5: a task whose start is 0 (none recorded) does not make the job start at 0.
        "j5,worker,1.0,Terminated,0.0,0.0,600.0,29.0,100.0,\n"
        "j5,ps,1.0,Terminated,1850.0,2000.0,600.0,29.0,100.0,\n"
        # j6: an end time of 0, none recorded: never ran to an end.
        "j6,worker,1.0,Running,1900.0,0.0,600.0,29.0,100.0,\n")
    p = convert("pai", jobs, tasks)
    assert p.returncode == 0, p.stderr
    assert [(r["job"], r["arrival_s"], r["gpus"], r["duration_s"]) for r in rows(p.stdout)] == [
        ("j1", "0.000", "2", "3590.000"),
        ("j2", "200.000", "1", "50.000"),
        ("j5", "800.000", "2", "150.000"),
    ]
    assert "6 jobs read, 3 kept, dropped: 2 never ran, 1 no GPUs" in p.stderr, p.stderr


def test_slice(tmp_path):
    src = tmp_path / "philly_data_training.csv"
    src.write_text(
        "u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status\n"
        "0,1,1,0,1,0,7200,0,Killed\n"
        "2,2,8,0,1,3600,600,0,Pass\n"   # one hour after the first submission
        "1,2,0,4,1,0,60,0,Pass\n"       # a CPU job, same second
        "3,3,16,0,2,1800,1200,0,Failed\n")
    p = convert("slice", src, "--devices", 8)
    assert p.returncode == 0, p.stderr
    assert [(r["job"], r["arrival_s"], r["gpus"], r["duration_s"]) for r in rows(p.stdout)] == [
        ("job0", "0.000", "1", "7200.000"),
        ("job2", "3600.000", "8", "600.000"),
    ]
    assert "4 jobs read, 2 kept, dropped: 1 more than 8 devices, 1 no GPUs" in p.stderr
    # Work 1 x 7200 + 8 x 600 = 12000 device-seconds; no schedule ends before 7200 s (job0).
    assert f"utilisation bound on 8 devices: {100 * 12000 / (8 * 7200):.1f}%" in p.stderr
    assert "no schedule ends before 2.0 h" in p.stderr
    # Work cannot start before it arrives: two 2-device jobs of 1 h arriving at 3600 s on 2
    # devices end at 3 h at the earliest, though each alone would end at 2 h.
    late = tmp_path / "late.csv"
    late.write_text("u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status\n"
                    "0,1,1,0,1,0,100,0,Pass\n"
                    "1,1,2,0,1,3600,3600,0,Pass\n"
                    "2,1,2,0,1,0,3600,0,Pass\n")
    p = convert("slice", late, "--devices", 2)
    assert "no schedule ends before 3.0 h" in p.stderr, p.stderr
    assert f"utilisation bound on 2 devices: {100 * 14500 / (2 * 10800):.1f}%" in p.stderr
    p = convert("slice", src, "--completed-only", "--devices", 0)
    assert [r["job"] for r in rows(p.stdout)] == ["job2"]
    src.write_text("u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status\n"
                   "0,1,1,0,1,-5,7200,0,Pass\n")
    p = convert("slice", src)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "interval = -5" in p.stderr


def test_slice_elastic(tmp_path):
    src = tmp_path / "helios_data_training.csv"
    src.write_text("u_id,user,gpu_num,cpu_num,node_num,interval,run_time,wall_time,new_status\n"
                   "0,1,1,0,1,0,7200,0,Pass\n"
                   "1,1,3,0,1,10,600,0,Pass\n"
                   "2,1,8,0,1,10,600,0,Pass\n")
    span = lambda p: [(r["gpus"], r["min_gpus"], r["max_gpus"]) for r in rows(p.stdout)]
    # From ceil(gpus / F) to F x gpus, at most --devices.
    p = convert("slice", src, "--elastic", 2, "--devices", 12)
    assert p.returncode == 0, p.stderr
    assert span(p) == [("1", "1", "2"), ("3", "2", "6"), ("8", "4", "12")]
    assert "no utilisation bound" in p.stderr and "utilisation bound on" not in p.stderr
    p = convert("slice", src, "--elastic", 4, "--devices", 0)
    assert span(p) == [("1", "1", "4"), ("3", "1", "12"), ("8", "2", "32")]
    assert span(convert("slice", src)) == [("1", "", ""), ("3", "", ""), ("8", "", "")]
    out = tmp_path / "out.csv"
    p = convert("slice", src, "--elastic", 1, "--output", out)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--elastic 1" in p.stderr
    assert not out.exists()


def test_bad_input_is_one_line_and_exit_code_2(tmp_path):
    src = tmp_path / "bad.json"
    src.write_text(json.dumps([{"jobid": "a", "status": "Pass", "submitted_time": "yesterday",
                                "attempts": [attempt("2017-10-07 01:12:09", "2017-10-07 01:13:23", [1])]}]))
    out = tmp_path / "out.csv"
    p = convert("philly", src, "--output", out)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "submitted_time" in p.stderr and "yesterday" in p.stderr
    assert not out.exists() and not Path(str(out) + ".part").exists(), "no half-written file"
    p = convert("helios", tmp_path / "missing.csv")
    assert p.returncode == 2 and "missing.csv" in p.stderr
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    p = convert("helios", tmp_path / "x.csv")
    assert p.returncode == 2 and "expected a header" in p.stderr
    p = convert("pai", tmp_path / "x.csv")
    assert p.returncode == 2 and "pai_task_table" in p.stderr


@pytest.mark.skipif(dualpipe_cli() is None, reason="no built dualpipe CLI (set DUALPIPE_BIN)")
def test_the_converted_trace_simulates(tmp_path):
    src = tmp_path / "cluster_job_log"
    src.write_text(json.dumps(PHILLY))
    out = tmp_path / "trace.csv"
    assert convert("philly", src, "--output", out).returncode == 0
    p = subprocess.run([str(dualpipe_cli()), "cluster", "simulate", "--cluster",
                        REPO_ROOT / "testdata" / "cluster" / "64x8.json", "--trace", out,
                        "--policy", "elastic", "--format", "json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert 0 < report["utilization"] <= 1
    assert report["makespan_s"] >= 3674
