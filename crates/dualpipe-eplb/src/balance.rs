//! EPLB as one call: [`plan`] validates a request, runs the chosen [`Planner`], and, given the
//! placement in force, lists the expert moves; the result is a [`PlanOutcome`].
//!
//! ```
//! use dualpipe_eplb::{plan, Layout, LoadMatrix, Planner};
//!
//! let loads = LoadMatrix::from_rows(vec![vec![40.0, 10.0, 30.0, 20.0]]).unwrap();
//! let layout = Layout::of_loads(&loads, 8, 2, 2, 4);
//! let first = plan(&loads, &layout, &Planner::default(), None, 0).unwrap();
//! let previous = first.placement();
//! let shifted = LoadMatrix::from_rows(vec![vec![10.0, 40.0, 30.0, 20.0]]).unwrap();
//! let next = plan(&shifted, &layout, &Planner::default(), Some(&previous), 1 << 20).unwrap();
//! assert!(next.moves.is_some());
//! assert!(next.stats.after.total.imbalance() <= next.stats.before.total.imbalance());
//! ```

use crate::improved::{check_domain_size, rebalance_improved, Decision, PlannerOptions};
use crate::layout::Layout;
use crate::matrix::LoadMatrix;
use crate::moves::{move_plan, MovePlan};
use crate::plan::{ExpertPlan, Policy};
use crate::previous::PreviousPlacement;
use crate::reference;
use crate::stats::PlanStats;
use crate::EplbError;

/// Which balancer to run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Planner {
    /// The improved, migration-aware policy ([`crate::improved`]).
    Improved(PlannerOptions),
    /// DeepSeek's EPLB, index for index, with this policy ([`Policy::Auto`]: the reference's
    /// own choice).
    Reference(Policy),
}

impl Default for Planner {
    /// The improved policy with its default options.
    fn default() -> Self {
        Planner::Improved(PlannerOptions::default())
    }
}

impl Planner {
    /// `improved` or `deepseek`, as the JSON output's `planner` member.
    pub fn name(&self) -> &'static str {
        match self {
            Planner::Improved(_) => "improved",
            Planner::Reference(_) => "deepseek",
        }
    }
}

/// A plan and everything said about it.
#[derive(Clone, Debug)]
pub struct PlanOutcome {
    /// The placement, in the reference's layout.
    pub plan: ExpertPlan,
    /// The planner that made it (`improved` or `deepseek`, see [`Planner::name`]).
    pub planner: &'static str,
    /// With the improved policy, how each layer's placement was obtained.
    pub decisions: Option<Vec<Decision>>,
    /// With a previous placement, the transfers that reach the new one.
    pub moves: Option<MovePlan>,
    /// Balance before (experts in order over GPUs, one copy each) and after the plan.
    pub stats: PlanStats,
}

impl PlanOutcome {
    /// The new placement, to pass as `previous` to the next [`plan`].
    pub fn placement(&self) -> PreviousPlacement {
        PreviousPlacement {
            phy2log: self.plan.phy2log_rows().unwrap_or_default(),
            gpus: Some(self.plan.num_gpus),
            nodes: Some(self.plan.num_nodes),
        }
    }
}

/// Checks that byte counts of a plan of `slots` slots cannot overflow with `expert_bytes` per
/// expert (every total is at most `slots x expert_bytes`).
pub fn check_expert_bytes(expert_bytes: u64, slots: usize) -> Result<(), EplbError> {
    let slots64 = u64::try_from(slots).unwrap_or(u64::MAX).max(1);
    if expert_bytes.checked_mul(slots64).is_none() {
        return Err(EplbError::ExpertBytesOverflow {
            expert_bytes,
            slots,
            max: u64::MAX / slots64,
        });
    }
    Ok(())
}

/// Plans `loads` (`[layers][experts]`) on `layout` with `planner`. With `previous`, the
/// placement in force, the outcome lists the moves from it (the improved policy also keeps as
/// much of it as the balance allows); `expert_bytes` (0 if unknown) turns moves into bytes.
///
/// Every problem with the request — sizes, loads, options, a previous placement of another
/// shape or topology, an `expert_bytes` whose totals would overflow — is an [`EplbError`]
/// before any planning.
pub fn plan(
    loads: &LoadMatrix,
    layout: &Layout,
    planner: &Planner,
    previous: Option<&PreviousPlacement>,
    expert_bytes: u64,
) -> Result<PlanOutcome, EplbError> {
    layout.validate(loads)?;
    let policy = match planner {
        Planner::Improved(opts) => {
            check_domain_size(layout)?;
            opts.check()?;
            None
        }
        Planner::Reference(policy) => Some(layout.resolve(*policy)?),
    };
    if let Some(prev) = previous {
        prev.check(loads.rows(), layout)?;
    }
    check_expert_bytes(expert_bytes, loads.rows() * layout.replicas)?;
    let (plan, decisions) = match (planner, policy) {
        (Planner::Improved(opts), _) => {
            let improved = rebalance_improved(
                &loads.to_rows(),
                layout,
                previous.map(|p| p.phy2log.as_slice()),
                opts,
            )?;
            let decisions = improved.layers.iter().map(|l| l.decision).collect();
            (
                ExpertPlan::from_phy2log(&improved.phy2log(), layout)?,
                Some(decisions),
            )
        }
        (Planner::Reference(_), Some(policy)) => (reference::plan(loads, layout, policy)?, None),
        (Planner::Reference(_), None) => unreachable!("the policy was resolved above"),
    };
    let moves = match previous {
        None => None,
        Some(prev) => {
            let new = plan
                .phy2log_rows()
                .expect("planners give non-negative expert indices");
            Some(move_plan(
                &prev.phy2log,
                &new,
                layout.gpus,
                layout.nodes,
                expert_bytes,
            ))
        }
    };
    let stats = plan.stats(loads)?;
    Ok(PlanOutcome {
        plan,
        planner: planner.name(),
        decisions,
        moves,
        stats,
    })
}

/// Computes the reference's plan with the policy it would choose ([`Policy::Auto`]).
///
/// `loads` is `[layers][logical experts]`; `num_replicas` physical slots per layer are
/// spread evenly over `num_gpus` GPUs in `num_nodes` nodes; the experts form `num_groups`
/// equal groups of consecutive experts. The result equals, index for index, what DeepSeek's
/// `eplb.rebalance_experts` returns for the same loads (see `docs/eplb.md` for how ties are
/// broken). Loads are rounded to `f32` first, as the reference does. A thin wrapper over
/// [`plan`] with [`Planner::Reference`].
///
/// ```
/// use dualpipe_eplb::{rebalance_experts, LoadMatrix};
/// let loads = LoadMatrix::from_rows(vec![vec![10.0, 1.0, 1.0, 1.0]]).unwrap();
/// let plan = rebalance_experts(&loads, 6, 1, 1, 2).unwrap();
/// assert_eq!(plan.logcnt.row(0), &[3, 1, 1, 1]);
/// ```
pub fn rebalance_experts(
    loads: &LoadMatrix,
    num_replicas: usize,
    num_groups: usize,
    num_nodes: usize,
    num_gpus: usize,
) -> Result<ExpertPlan, EplbError> {
    rebalance_experts_with_policy(
        loads,
        num_replicas,
        num_groups,
        num_nodes,
        num_gpus,
        Policy::Auto,
    )
}

/// Like [`rebalance_experts`], with the policy chosen explicitly.
///
/// [`Policy::Hierarchical`] fails with [`EplbError::GroupsNotMultipleOfNodes`] when the
/// groups do not divide over the nodes. Large inputs are planned in parallel over layers
/// (rayon); the result does not depend on the number of threads.
pub fn rebalance_experts_with_policy(
    loads: &LoadMatrix,
    num_replicas: usize,
    num_groups: usize,
    num_nodes: usize,
    num_gpus: usize,
    policy: Policy,
) -> Result<ExpertPlan, EplbError> {
    let layout = Layout::of_loads(loads, num_replicas, num_groups, num_nodes, num_gpus);
    layout.validate(loads)?;
    let policy = layout.resolve(policy)?;
    reference::plan(loads, &layout, policy)
}
