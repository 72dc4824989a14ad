"""dualpipe_rs.schedule: the object, its programs, its text forms and its errors."""

from __future__ import annotations

import json

import pytest

import dualpipe_rs
from conftest import golden_files, load_golden

COMPUTE = {"F", "B", "I", "W", "FB"}


def test_schedule_object_describes_itself():
    s = dualpipe_rs.schedule("dualpipe", 4, 8)
    assert isinstance(s, dualpipe_rs.Schedule)
    assert (s.kind, s.ranks, s.micro_batches, s.virtual_stages) == ("dualpipe", 4, 8, 1)
    assert len(s) == 4
    assert len(s.programs) == 4
    assert "dualpipe" in repr(s)
    # DualPipe keeps two copies of every stage: rank r runs stage r of direction 0 and stage
    # ranks-1-r of direction 1.
    assert s.placement == [[0, 1, 2, 3], [3, 2, 1, 0]]
    assert s.parameter_copies == [2, 2, 2, 2]


def test_keywords_and_kind_names_are_case_insensitive():
    a = dualpipe_rs.schedule("1F1B", ranks=4, micro_batches=8)
    b = dualpipe_rs.schedule(kind="1f1b", ranks=4, micro_batches=8, virtual_stages=1)
    assert a.programs == b.programs
    assert a.kind == "1f1b"


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "zb1p", "dualpipe", "dualpipev"])
def test_every_chunk_runs_forward_once(kind):
    s = dualpipe_rs.schedule(kind, 4, 8)
    forwards = set()
    for rank, program in enumerate(s.programs):
        for op in program:
            assert op["op"] in COMPUTE | {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "WAIT"}
            if op["op"] == "F":
                key = (op.get("dir", 0), op["stage"], op["mb"])
                assert key not in forwards, f"{kind}: forward of {key} twice"
                forwards.add(key)
            elif op["op"] == "FB":
                key = (op["f"].get("dir", 0), op["f"]["stage"], op["f"]["mb"])
                assert key not in forwards
                forwards.add(key)
    dirs = len(s.placement)
    stages = len(s.placement[0])
    assert len(forwards) == dirs * stages * (s.micro_batches // dirs)


def test_interleaved_uses_virtual_stages():
    s = dualpipe_rs.schedule("interleaved", 4, 8, virtual_stages=3)
    assert s.virtual_stages == 3
    assert len(s.placement[0]) == 12
    assert s.parameter_copies == [3, 3, 3, 3]
    # Without virtual_stages, each kind's default: 2 for interleaved (as `dualpipe simulate`).
    assert dualpipe_rs.schedule("interleaved", 4, 8).virtual_stages == 2
    assert dualpipe_rs.schedule("1f1b", 4, 8).virtual_stages == 1


def test_kinds_that_fix_their_virtual_stages_reject_others():
    with pytest.raises(ValueError, match="fixed by the schedule"):
        dualpipe_rs.schedule("dualpipev", 2, 4, virtual_stages=3)


def test_compute_programs_drop_communication():
    s = dualpipe_rs.schedule("dualpipev", 4, 8)
    full = s.programs
    compute = s.compute_programs()
    for f, c in zip(full, compute):
        assert c == [op for op in f if op["op"] in COMPUTE]
    assert any(op["op"] == "SEND_F" for program in full for op in program)


@pytest.mark.parametrize("path", golden_files("dualpipe"))
def test_compute_order_matches_reference(path):
    case = load_golden(path)
    s = dualpipe_rs.schedule(case["schedule"], case["ranks"], case["micro_batches"])
    want = [[op for op in prog if op["op"] in COMPUTE] for prog in case["programs"]]
    # Single-direction schedules (DualPipeV) carry no "dir", as in the golden files.
    assert s.compute_programs() == want


@pytest.mark.parametrize(
    "args",
    [
        ("nope", 4, 8),
        ("dualpipe", 3, 8),  # DualPipe needs an even number of ranks
        ("dualpipe", 4, 3),
        ("1f1b", 0, 8),
        ("interleaved", 4, 8, 0),
    ],
)
def test_bad_arguments_raise_value_error(args):
    with pytest.raises(ValueError) as info:
        dualpipe_rs.schedule(*args)
    assert str(info.value)


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        dualpipe_rs.schedule("dualpip", 4, 8)
    assert str(info.value) == (
        "unknown schedule 'dualpip': use one of gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev"
    )


def test_configuration_errors_name_the_keyword_arguments():
    with pytest.raises(ValueError) as info:
        dualpipe_rs.schedule("dualpipe", 3, 8)
    msg = str(info.value)
    assert msg.startswith("dualpipe needs an even number of ranks"), msg
    # Settings by this function's keyword arguments, never by the command line's flags.
    assert "use ranks=2 or ranks=4" in msg and "--" not in msg, msg
    with pytest.raises(ValueError) as info:
        dualpipe_rs.schedule("gpipe", 1024, 16384)
    assert "at most micro_batches=2048 with 1024 ranks" in str(info.value), str(info.value)


def test_negative_sizes_are_value_errors():
    with pytest.raises(ValueError, match="ranks must be a non-negative integer, got -4"):
        dualpipe_rs.schedule("1f1b", -4, 8)
    with pytest.raises(ValueError, match="micro_batches"):
        dualpipe_rs.schedule("1f1b", 4, -8)
    with pytest.raises(ValueError, match="virtual_stages"):
        dualpipe_rs.schedule("interleaved", 4, 8, -2)
    with pytest.raises(ValueError, match="ranks"):
        dualpipe_rs.simulate("1f1b", -4, 8)
    with pytest.raises(TypeError):
        dualpipe_rs.schedule("1f1b", 4.0, 8)


def test_to_json_is_the_golden_schema_and_round_trips():
    for kind in ("dualpipe", "dualpipev", "zb1p"):
        s = dualpipe_rs.schedule(kind, 4, 8)
        doc = json.loads(s.to_json())
        assert doc["schedule"] == kind
        assert doc["ranks"] == 4
        assert doc["micro_batches"] == 8
        assert doc["programs"] == s.programs
        again = dualpipe_rs.Schedule.from_json(s.to_json())
        assert again == s
        assert again.to_json() == s.to_json()


@pytest.mark.parametrize("path", golden_files("dualpipe")[:6])
def test_from_json_reads_golden_files(path):
    case = load_golden(path)
    with open(path) as f:
        s = dualpipe_rs.Schedule.from_json(f.read())
    assert (s.kind, s.ranks, s.micro_batches) == (
        case["schedule"],
        case["ranks"],
        case["micro_batches"],
    )


def test_from_json_errors_are_value_errors():
    with pytest.raises(ValueError, match="not valid JSON"):
        dualpipe_rs.Schedule.from_json("{")
    doc = json.loads(dualpipe_rs.schedule("1f1b", 2, 4).to_json())
    doc["programs"][0] = doc["programs"][0][1:]  # drop rank 0's first forward
    with pytest.raises(ValueError):
        dualpipe_rs.Schedule.from_json(json.dumps(doc))


def test_to_torch_csv_has_one_row_per_rank_of_compute_actions():
    s = dualpipe_rs.schedule("1f1b", 4, 8)
    text = s.to_torch_csv()
    rows = text.splitlines()
    assert len(rows) == 4
    assert [row.split(",") for row in rows] == s.actions
    for rank, actions in enumerate(s.actions):
        # 1F1B: rank r runs stage r; 8 forwards and 8 full backwards.
        forwards = [a for a in actions if a.startswith(f"{rank}F")]
        backwards = [a for a in actions if a.startswith(f"{rank}B")]
        assert forwards == [f"{rank}F{mb}" for mb in range(8)]
        assert backwards == [f"{rank}B{mb}" for mb in range(8)]
        assert len(actions) == 16


def test_dualpipe_csv_uses_global_stages_and_overlap_cells():
    s = dualpipe_rs.schedule("dualpipe", 4, 16)
    cells = [c for row in s.actions for c in row]
    assert any(c.endswith(")OVERLAP_F_B") for c in cells)
    # Direction 1's stages are numbered ranks + s: 8 global stages in all.
    stages = {int(c.split("F")[0]) for c in cells if "F" in c and not c.startswith("(")}
    assert stages == set(range(8))


def test_torch_csv_round_trips():
    for kind in ("dualpipe", "dualpipev", "zb1p", "1f1b"):
        s = dualpipe_rs.schedule(kind, 4, 8)
        again = dualpipe_rs.Schedule.from_torch_csv(s.to_torch_csv(), kind=kind)
        assert again.compute_programs() == s.compute_programs()
        assert again.to_torch_csv() == s.to_torch_csv()
        assert any(op["op"] == "SEND_F" for p in again.programs for op in p)


def test_from_torch_csv_errors_are_value_errors():
    with pytest.raises(ValueError, match="CSV schedule"):
        dualpipe_rs.Schedule.from_torch_csv("0X1\n")
    with pytest.raises(ValueError, match="unknown schedule"):
        dualpipe_rs.Schedule.from_torch_csv("0F0,0B0\n", kind="nope")


# --- torch.distributed.pipelining accepts our CSV (optional: needs torch) ----------------------


@pytest.mark.parametrize(
    "kind, ranks, mbs",
    [("1f1b", 4, 8), ("gpipe", 2, 4), ("zb1p", 4, 8), ("interleaved", 4, 8), ("dualpipev", 4, 8)],
)
def test_torch_reads_and_validates_the_csv(kind, ranks, mbs):
    pytest.importorskip("torch")
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    needed = ("_Action", "_validate_schedule", "_add_send_recv")
    if not all(hasattr(schedules, name) for name in needed):
        pytest.skip("this torch has no compute-only CSV helpers")
    s = dualpipe_rs.schedule(kind, ranks, mbs)
    actions = {
        rank: [schedules._Action.from_str(cell) for cell in row]
        for rank, row in enumerate(s.actions)
    }
    assert [[str(a) for a in actions[r]] for r in range(ranks)] == s.actions
    num_stages = sum(len(row) for row in s.placement)
    stage_to_rank = {
        d * len(row) + stage: rank for d, row in enumerate(s.placement) for stage, rank in enumerate(row)
    }
    schedules._validate_schedule(actions, ranks, num_stages, mbs)
    with_comms = schedules._add_send_recv(actions, stage_to_rank.__getitem__, num_stages)
    assert len(with_comms) == ranks
