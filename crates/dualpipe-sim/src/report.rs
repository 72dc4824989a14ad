//! What `dualpipe simulate` and `dualpipe compare` compute and print, as library functions:
//! build a schedule, simulate it, measure it, compare kinds, and format the results.

use std::fmt::Write as _;

use dualpipe_schedule::{Schedule, ScheduleError, ScheduleKind};
use serde::Serialize;

use crate::cost::CostModel;
use crate::error::SimError;
use crate::formula::{readme_formula, ReadmeFormula};
use crate::metrics::{metrics, Metrics};
use crate::simulate::simulate;
use crate::svg::num;
use dualpipe_schedule::timeline::Timeline;

/// Why a schedule could not be simulated.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The schedule kind rejects the configuration (or its generator failed).
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// The cost model is invalid or the schedule cannot be simulated.
    #[error(transparent)]
    Sim(#[from] SimError),
}

/// The result of one simulation, ready to print or serialise.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimulationReport {
    /// Schedule kind name (`"dualpipe"`, ...).
    pub schedule: String,
    /// Ranks (devices); serialised once, by the flattened metrics.
    #[serde(skip)]
    pub ranks: usize,
    /// Micro-batches in the step.
    pub micro_batches: usize,
    /// Virtual stages per rank (interleaved only; 1 otherwise).
    pub virtual_stages: usize,
    /// Stages along one pipeline (`PP`).
    pub pp: usize,
    /// The cost model simulated.
    pub cost: CostModel,
    /// The metrics of the simulated timeline.
    #[serde(flatten)]
    pub metrics: Metrics,
    /// The DualPipe README's closed form for this kind, if it has one.
    pub readme: Option<ReadmeFormula>,
}

/// A simulated schedule with its timeline and report.
#[derive(Clone, Debug)]
pub struct Run {
    /// The generated, lowered and validated schedule.
    pub schedule: Schedule,
    /// Its simulated timeline.
    pub timeline: Timeline,
    /// Its metrics and configuration.
    pub report: SimulationReport,
}

/// What the compute durations of a comparison are measured on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CostBasis {
    /// Per stage chunk, as in the DualPipe README: every kind runs chunks of the given
    /// durations (kinds with more stages per rank then model a bigger network).
    #[default]
    PerStage,
    /// Per rank's share of one fixed model: a kind with `PP` stages on `ranks` ranks runs
    /// chunks of `ranks / PP` of the given durations (half for DualPipeV and for interleaved
    /// with 2 virtual stages).
    PerRank,
}

impl CostModel {
    /// The model with every compute duration multiplied by `factor` (communication kept).
    pub fn scaled(&self, factor: f64) -> CostModel {
        let scale = |c: &crate::cost::StageCost| {
            crate::cost::StageCost::new(c.f * factor, c.b * factor, c.w * factor, c.fb * factor)
        };
        CostModel {
            compute: scale(&self.compute),
            per_stage: self.per_stage.iter().map(scale).collect(),
            comm: self.comm,
            rank_speed: self.rank_speed.clone(),
            network: self.network.clone(),
            expert_comm: self.expert_comm,
        }
    }
}

/// The name a schedule kind goes by in papers and figure titles ("DualPipeV", "1F1B", ...).
pub fn display_name(kind: ScheduleKind) -> &'static str {
    match kind {
        ScheduleKind::GPipe => "GPipe",
        ScheduleKind::OneFOneB => "1F1B",
        ScheduleKind::Interleaved => "Interleaved 1F1B",
        ScheduleKind::Zb1p => "ZB1P (ZB-H1)",
        ScheduleKind::DualPipe => "DualPipe",
        ScheduleKind::DualPipeV => "DualPipeV",
    }
}

/// The report of an already simulated schedule.
pub fn report(schedule: &Schedule, timeline: &Timeline, cost: &CostModel) -> SimulationReport {
    SimulationReport {
        schedule: schedule.kind.name().to_string(),
        ranks: schedule.ranks,
        micro_batches: schedule.micro_batches,
        virtual_stages: schedule.virtual_stages,
        pp: schedule.placement.stages(),
        cost: cost.clone(),
        metrics: metrics(timeline, &schedule.placement),
        readme: readme_formula(schedule.kind, schedule.ranks, &cost.compute),
    }
}

/// Builds (generates, lowers, validates) a schedule of `kind` and simulates it on `cost`.
pub fn run(
    kind: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
    cost: &CostModel,
) -> Result<Run, RunError> {
    cost.check()?;
    let schedule = dualpipe_schedule::build(kind, ranks, micro_batches, virtual_stages)?;
    run_schedule(schedule, cost)
}

/// Simulates an already built (lowered, validated) schedule on `cost`, such as one read from a
/// file with [`dualpipe_schedule::format::read_schedule`].
pub fn run_schedule(schedule: Schedule, cost: &CostModel) -> Result<Run, RunError> {
    cost.check()?;
    let timeline = simulate(&schedule, cost)?;
    let report = report(&schedule, &timeline, cost);
    Ok(Run {
        schedule,
        timeline,
        report,
    })
}

/// A human-readable table of a report: per-rank busy, bubble, communication wait, peak
/// activations and parameter copies, then the totals and the README's formula.
pub fn report_table(r: &SimulationReport) -> String {
    let m = &r.metrics;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} on {} ranks, {} micro-batches, PP = {} stages{}",
        r.schedule,
        r.ranks,
        r.micro_batches,
        r.pp,
        if r.virtual_stages > 1 {
            format!(", {} virtual stages", r.virtual_stages)
        } else {
            String::new()
        }
    );
    let c = &r.cost.compute;
    let comm = &r.cost.comm;
    let _ = writeln!(
        out,
        "cost: F {} B {} W {} I {} F&B {}; message {} s{}",
        num(c.f),
        num(c.b),
        num(c.w),
        num(c.i()),
        num(c.fb),
        num(comm.message_time()),
        if comm.blocking { " (blocking)" } else { "" }
    );
    let headers = [
        "rank",
        "busy",
        "bubble",
        "comm wait",
        "peak act",
        "param copies",
    ];
    let rows: Vec<[String; 6]> = (0..m.ranks)
        .map(|k| {
            [
                k.to_string(),
                num(m.busy_per_rank[k]),
                num(m.bubble_per_rank[k]),
                num(m.comm_wait_per_rank.get(k).copied().unwrap_or(0.0)),
                m.peak_activations_per_rank[k].to_string(),
                m.parameter_copies_per_rank
                    .get(k)
                    .copied()
                    .unwrap_or(0)
                    .to_string(),
            ]
        })
        .collect();
    out.push_str(&table(&headers, &rows));
    let _ = writeln!(
        out,
        "makespan {} | max bubble {} | bubble ratio {:.2}% | peak activations {}",
        num(m.makespan),
        num(m.bubble_max),
        100.0 * m.bubble_ratio,
        m.peak_activations
    );
    if let Some(f) = &r.readme {
        let _ = writeln!(
            out,
            "README formula (PP = {}): bubble {} {} (simulated max per rank {}), activations {} (simulated {}), parameter copies {}",
            f.pp,
            if f.bubble_exact { "=" } else { "<=" },
            num(f.bubble),
            num(m.bubble_max),
            f.activations,
            m.peak_activations,
            f.parameter_copies
        );
        let dualpipe = matches!(r.schedule.as_str(), "dualpipe" | "dualpipev");
        if dualpipe && c.f + 3.0 * c.w > 2.0 * c.b {
            out.push_str(
                "note: the README's DualPipe bound assumes F + 3W <= 2B; here the most idle rank idles at least (PP/2-1)(F + F&B - B)\n",
            );
        }
    }
    out
}

/// One schedule kind in a comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompareRow {
    /// Schedule kind name.
    pub schedule: String,
    /// Stages along one pipeline (`PP`).
    pub pp: usize,
    /// Devices (ranks) it runs on.
    pub devices: usize,
    /// Compute durations of one chunk relative to the given ones (1 on a per-stage basis).
    pub chunk_scale: f64,
    /// Simulated step time.
    pub makespan: f64,
    /// Idle time of the most idle rank.
    pub bubble: f64,
    /// Total idle time over `ranks x makespan`.
    pub bubble_ratio: f64,
    /// Peak live activations on the busiest rank (units of one micro-batch at one stage).
    pub peak_activations: usize,
    /// Most parameter copies (stages) on one rank.
    pub parameter_copies: usize,
}

/// A schedule kind that does not accept the configuration, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rejected {
    /// Schedule kind name.
    pub schedule: String,
    /// The generator's (or simulator's) reason.
    pub reason: String,
}

/// Every schedule kind simulated on one configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Ranks (devices).
    pub ranks: usize,
    /// Micro-batches in the step.
    pub micro_batches: usize,
    /// Virtual stages per rank used by the interleaved schedule.
    pub virtual_stages: usize,
    /// The cost model, as given.
    pub cost: CostModel,
    /// What the compute durations are measured on.
    pub basis: CostBasis,
    /// Kinds that accept the configuration, in [`ScheduleKind::ALL`] order.
    pub schedules: Vec<CompareRow>,
    /// Kinds that do not, with the reason.
    pub rejected: Vec<Rejected>,
}

/// Simulates every schedule kind on one configuration.
pub fn compare(
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
    cost: &CostModel,
    basis: CostBasis,
) -> Result<Comparison, SimError> {
    cost.check()?;
    let mut schedules = Vec::new();
    let mut rejected = Vec::new();
    for kind in ScheduleKind::ALL {
        // Only the interleaved schedule lets the user choose its stages per rank.
        let v = if kind == ScheduleKind::Interleaved {
            virtual_stages
        } else {
            1
        };
        let outcome = dualpipe_schedule::build(kind, ranks, micro_batches, v)
            .map_err(RunError::from)
            .and_then(|schedule| {
                let stages = schedule.placement.stages().max(1);
                let kind_cost = match basis {
                    CostBasis::PerStage => cost.clone(),
                    CostBasis::PerRank => cost.scaled(ranks as f64 / stages as f64),
                };
                let timeline = simulate(&schedule, &kind_cost)?;
                let report = report(&schedule, &timeline, &kind_cost);
                Ok(Run {
                    schedule,
                    timeline,
                    report,
                })
            });
        match outcome {
            Ok(run) => {
                let m = &run.report.metrics;
                schedules.push(CompareRow {
                    schedule: kind.name().to_string(),
                    pp: run.report.pp,
                    devices: run.schedule.ranks,
                    chunk_scale: match basis {
                        CostBasis::PerStage => 1.0,
                        CostBasis::PerRank => ranks as f64 / run.report.pp.max(1) as f64,
                    },
                    makespan: m.makespan,
                    bubble: m.bubble_max,
                    bubble_ratio: m.bubble_ratio,
                    peak_activations: m.peak_activations,
                    parameter_copies: m
                        .parameter_copies_per_rank
                        .iter()
                        .copied()
                        .max()
                        .unwrap_or(0),
                });
            }
            Err(err) => rejected.push(Rejected {
                schedule: kind.name().to_string(),
                reason: err.to_string(),
            }),
        }
    }
    Ok(Comparison {
        ranks,
        micro_batches,
        virtual_stages,
        cost: cost.clone(),
        basis,
        schedules,
        rejected,
    })
}

/// A human-readable table of a comparison, followed by the rejected kinds.
pub fn comparison_table(c: &Comparison) -> String {
    let mut out = String::new();
    let k = &c.cost.compute;
    let _ = writeln!(
        out,
        "{} ranks, {} micro-batches; F {} B {} W {} F&B {}; message {} s",
        c.ranks,
        c.micro_batches,
        num(k.f),
        num(k.b),
        num(k.w),
        num(k.fb),
        num(c.cost.comm.message_time())
    );
    let headers = [
        "schedule",
        "PP",
        "devices",
        "makespan",
        "bubble",
        "bubble ratio",
        "peak act",
        "param copies",
    ];
    let rows: Vec<[String; 8]> = c
        .schedules
        .iter()
        .map(|r| {
            [
                r.schedule.clone(),
                r.pp.to_string(),
                r.devices.to_string(),
                num(r.makespan),
                num(r.bubble),
                format!("{:.2}%", 100.0 * r.bubble_ratio),
                r.peak_activations.to_string(),
                r.parameter_copies.to_string(),
            ]
        })
        .collect();
    out.push_str(&table(&headers, &rows));
    out.push_str(match c.basis {
        CostBasis::PerStage => {
            "durations per stage chunk (the README's basis); bubble = idle time of the most idle rank; peak act in micro-batch x stage units\n"
        }
        CostBasis::PerRank => {
            "durations per rank's share of one model (chunks of ranks/PP of them); bubble = idle time of the most idle rank; peak act in chunk units\n"
        }
    });
    for r in &c.rejected {
        let _ = writeln!(out, "not applicable: {}: {}", r.schedule, r.reason);
    }
    out
}

/// Left-aligned first column, right-aligned others, two spaces apart.
fn table<const N: usize>(headers: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths: [usize; N] = headers.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut parts = Vec::with_capacity(N);
        for (i, cell) in cells.enumerate() {
            if i == 0 {
                parts.push(format!("{cell:<w$}", w = widths[i]));
            } else {
                parts.push(format!("{cell:>w$}", w = widths[i]));
            }
        }
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut out, &mut headers.iter().copied());
    for row in rows {
        line(&mut out, &mut row.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["a", "bb"],
            &[["xyz".into(), "1".into()], ["q".into(), "22".into()]],
        );
        assert_eq!(t, "a    bb\nxyz   1\nq    22\n");
    }

    #[test]
    fn bad_costs_are_reported_before_any_schedule_is_built() {
        let cost = CostModel::uniform(1.0, 1.0, 2.0, 2.0);
        assert!(matches!(
            compare(4, 8, 1, &cost, CostBasis::PerStage),
            Err(SimError::Cost(_))
        ));
        assert!(matches!(
            run(ScheduleKind::OneFOneB, 4, 8, 1, &cost),
            Err(RunError::Sim(_))
        ));
    }
}
