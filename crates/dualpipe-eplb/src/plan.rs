//! The public entry points: [`rebalance_experts`], [`Policy`] and the resulting [`Plan`].

use serde::{Deserialize, Serialize};

use crate::matrix::{LoadMatrix, Matrix, Tensor3};
use crate::reference;
use crate::EplbError;

/// Which of the reference's two placement policies to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Policy {
    /// The reference's choice: [`Policy::Hierarchical`] when the expert groups divide evenly
    /// over the nodes (`num_groups % num_nodes == 0`), [`Policy::Global`] otherwise.
    #[default]
    Auto,
    /// Pack expert groups onto nodes, replicate hot experts within each node, then pack each
    /// node's replicas onto its GPUs. Keeps a group's experts on one node (less inter-node
    /// traffic with group-limited routing).
    Hierarchical,
    /// Ignore groups and nodes: replicate over all experts, then pack all replicas onto all
    /// GPUs.
    Global,
}

impl Policy {
    /// The policy `Auto` resolves to for this topology; other policies return themselves.
    pub fn resolve(self, num_groups: usize, num_nodes: usize) -> Policy {
        match self {
            Policy::Auto if num_nodes != 0 && num_groups.is_multiple_of(num_nodes) => {
                Policy::Hierarchical
            }
            Policy::Auto => Policy::Global,
            other => other,
        }
    }

    /// The lowercase name, as accepted by [`str::parse`].
    pub fn name(self) -> &'static str {
        match self {
            Policy::Auto => "auto",
            Policy::Hierarchical => "hierarchical",
            Policy::Global => "global",
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Policy::Auto),
            "hierarchical" => Ok(Policy::Hierarchical),
            "global" => Ok(Policy::Global),
            other => Err(format!(
                "unknown policy `{other}`; expected auto, hierarchical or global"
            )),
        }
    }
}

/// A replication and placement plan for every MoE layer, in the reference's layout.
///
/// Physical expert slots (replicas) are numbered `0 .. num_replicas` per layer; slot `p`
/// lives on GPU `p / (num_replicas / num_gpus)` and node `gpu / (num_gpus / num_nodes)`.
/// Indices are `i64` as in the reference, so `-1` can pad `log2phy`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The policy that produced the plan (never [`Policy::Auto`]).
    pub policy: Policy,
    /// Number of expert groups the plan was made for.
    pub num_groups: usize,
    /// Number of nodes.
    pub num_nodes: usize,
    /// Number of GPUs.
    pub num_gpus: usize,
    /// `[layers][replicas]`: the logical expert held by each physical slot.
    pub phy2log: Matrix<i64>,
    /// `[layers][replicas]`: which copy of its expert each slot holds (0 for the first
    /// replica of an expert, 1 for the second, ...).
    pub phyrank: Matrix<i64>,
    /// `[layers][experts][max replicas]`: the physical slots of each logical expert, ordered
    /// by replica rank and padded with `-1`. The width is the largest replica count of any
    /// expert in any layer, as in the reference.
    pub log2phy: Tensor3<i64>,
    /// `[layers][experts]`: the number of replicas of each logical expert (at least 1).
    pub logcnt: Matrix<i64>,
}

impl Plan {
    /// Number of MoE layers.
    pub fn num_layers(&self) -> usize {
        self.phy2log.rows()
    }

    /// Number of logical experts per layer.
    pub fn num_experts(&self) -> usize {
        self.logcnt.cols()
    }

    /// Number of physical expert slots per layer.
    pub fn num_replicas(&self) -> usize {
        self.phy2log.cols()
    }

    /// Physical slots on each GPU.
    pub fn replicas_per_gpu(&self) -> usize {
        self.num_replicas() / self.num_gpus.max(1)
    }

    /// The GPU that holds physical slot `phys`.
    pub fn gpu_of(&self, phys: usize) -> usize {
        phys / self.replicas_per_gpu().max(1)
    }

    /// The node that holds physical slot `phys`.
    pub fn node_of(&self, phys: usize) -> usize {
        self.gpu_of(phys) / (self.num_gpus / self.num_nodes.max(1)).max(1)
    }

    /// The width of `log2phy`: the largest replica count of any expert.
    pub fn max_replicas(&self) -> usize {
        self.log2phy.dims()[2]
    }
}

/// Computes the reference's plan with the policy it would choose ([`Policy::Auto`]).
///
/// `loads` is `[layers][logical experts]`; `num_replicas` physical slots per layer are
/// spread evenly over `num_gpus` GPUs in `num_nodes` nodes; the experts form `num_groups`
/// equal groups of consecutive experts. The result equals, index for index, what DeepSeek's
/// `eplb.rebalance_experts` returns for the same loads (see `docs/eplb.md` for how ties are
/// broken). Loads are rounded to `f32` first, as the reference does.
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
) -> Result<Plan, EplbError> {
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
) -> Result<Plan, EplbError> {
    let shape = check_inputs(loads, num_replicas, num_groups, num_nodes, num_gpus, policy)?;
    Ok(reference::plan(loads, &shape))
}

/// The most physical slots (layers x replicas) one plan may hold (2^31; the outputs take
/// 16 bytes per slot).
const MAX_SLOTS: usize = 1 << 31;

/// Validated sizes for one planning run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub policy: Policy,
    pub experts: usize,
    pub replicas: usize,
    pub user_groups: usize,
    pub user_nodes: usize,
    pub gpus: usize,
    /// Groups and nodes the algorithm runs with (1 and 1 for the global policy).
    pub groups: usize,
    pub nodes: usize,
}

fn check_inputs(
    loads: &LoadMatrix,
    replicas: usize,
    groups: usize,
    nodes: usize,
    gpus: usize,
    policy: Policy,
) -> Result<Shape, EplbError> {
    for (name, value) in [
        ("num_replicas", replicas),
        ("num_groups", groups),
        ("num_nodes", nodes),
        ("num_gpus", gpus),
    ] {
        if value == 0 {
            return Err(EplbError::ZeroCount { name });
        }
        if value > u32::MAX as usize / 2 {
            return Err(EplbError::TooLarge { name, value });
        }
    }
    let experts = loads.cols();
    if loads.rows() == 0 || experts == 0 {
        return Err(EplbError::EmptyLoads {
            layers: loads.rows(),
            experts,
        });
    }
    let slots = loads.rows().saturating_mul(replicas);
    if slots > MAX_SLOTS {
        return Err(EplbError::TooLarge {
            name: "layers x num_replicas",
            value: slots,
        });
    }
    if let Some(pos) = loads
        .as_slice()
        .iter()
        .position(|v| !(v.is_finite() && *v >= 0.0))
    {
        return Err(EplbError::InvalidLoad {
            layer: pos / experts,
            expert: pos % experts,
            value: loads.as_slice()[pos],
        });
    }
    if !experts.is_multiple_of(groups) {
        return Err(EplbError::ExpertsNotMultipleOfGroups { experts, groups });
    }
    if replicas < experts {
        return Err(EplbError::FewerReplicasThanExperts { replicas, experts });
    }
    if !replicas.is_multiple_of(gpus) {
        return Err(EplbError::ReplicasNotMultipleOfGpus { replicas, gpus });
    }
    if !gpus.is_multiple_of(nodes) {
        return Err(EplbError::GpusNotMultipleOfNodes { gpus, nodes });
    }
    let policy = policy.resolve(groups, nodes);
    let (alg_groups, alg_nodes) = match policy {
        Policy::Hierarchical => {
            if !groups.is_multiple_of(nodes) {
                return Err(EplbError::GroupsNotMultipleOfNodes { groups, nodes });
            }
            (groups, nodes)
        }
        _ => (1, 1),
    };
    Ok(Shape {
        policy,
        experts,
        replicas,
        user_groups: groups,
        user_nodes: nodes,
        gpus,
        groups: alg_groups,
        nodes: alg_nodes,
    })
}
