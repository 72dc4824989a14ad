//! The library behind `dualpipe simulate` and `dualpipe compare`.

use dualpipe_schedule::ScheduleKind;
use dualpipe_sim::report::{compare, comparison_table, report_table, run, CostBasis};
use dualpipe_sim::CostModel;

#[test]
fn simulate_json_has_the_documented_keys() {
    let cost = CostModel::uniform(1.0, 2.0, 1.0, 2.5);
    let r = run(ScheduleKind::DualPipe, 4, 8, 1, &cost).unwrap();
    let json: serde_json::Value = serde_json::to_value(&r.report).unwrap();
    for key in [
        "makespan",
        "bubble_per_rank",
        "bubble_ratio",
        "peak_activations_per_rank",
        "parameter_copies_per_rank",
        "schedule",
        "readme",
    ] {
        assert!(json.get(key).is_some(), "missing {key} in {json}");
    }
    assert_eq!(json["bubble_per_rank"].as_array().unwrap().len(), 4);
    assert_eq!(
        json["parameter_copies_per_rank"],
        serde_json::json!([2, 2, 2, 2])
    );
    let table = report_table(&r.report);
    assert!(table.contains("README formula (PP = 4)"), "{table}");
}

#[test]
fn compare_lists_every_kind_once_and_explains_rejections() {
    let cost = CostModel::uniform(1.0, 2.0, 1.0, 2.5);
    let c = compare(3, 6, 2, &cost, CostBasis::PerStage).unwrap();
    let mut names: Vec<&str> = c.schedules.iter().map(|r| r.schedule.as_str()).collect();
    names.extend(c.rejected.iter().map(|r| r.schedule.as_str()));
    names.sort_unstable();
    let mut all: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
    all.sort_unstable();
    assert_eq!(names, all);
    let dualpipe = c
        .rejected
        .iter()
        .find(|r| r.schedule == "dualpipe")
        .expect("odd ranks");
    assert!(dualpipe.reason.contains("even"), "{}", dualpipe.reason);
    let table = comparison_table(&c);
    assert!(table.contains("not applicable: dualpipe"), "{table}");
}

#[test]
fn per_rank_costs_shrink_the_chunks_of_kinds_with_more_stages_than_ranks() {
    let cost = CostModel::uniform(1.0, 2.0, 1.0, 2.5);
    let per_stage = compare(4, 8, 2, &cost, CostBasis::PerStage).unwrap();
    let per_rank = compare(4, 8, 2, &cost, CostBasis::PerRank).unwrap();
    for (a, b) in per_stage.schedules.iter().zip(&per_rank.schedules) {
        assert_eq!(a.schedule, b.schedule);
        let scale = 4.0 / a.pp as f64;
        assert_eq!(b.chunk_scale, scale, "{}", a.schedule);
        // Free communication: the whole timeline scales with the durations.
        assert!(
            (b.makespan - a.makespan * scale).abs() < 1e-9,
            "{}: {} vs {}",
            a.schedule,
            b.makespan,
            a.makespan
        );
    }
    let v = per_rank
        .schedules
        .iter()
        .find(|r| r.schedule == "dualpipev")
        .unwrap();
    assert_eq!(v.chunk_scale, 0.5);
}
