//! What a balancer produces: an [`ExpertPlan`] in the reference's layout, and the reference
//! [`Policy`] that made it.

use serde::{Deserialize, Serialize};

use crate::layout::{Layout, MAX_LOG2PHY};
use crate::matrix::{Matrix, Tensor3};
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
pub struct ExpertPlan {
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

impl ExpertPlan {
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

impl ExpertPlan {
    /// Builds a plan (with `phyrank`, `log2phy` and `logcnt` in the reference's layout) from a
    /// `phy2log` matrix (`[layers][replicas]`, every index below `layout.experts`). Replica
    /// ranks follow the physical order; `policy` is [`Policy::Hierarchical`] when the groups
    /// divide over the nodes, else [`Policy::Global`] (the improved policy's domains).
    pub fn from_phy2log(phy2log: &[Vec<usize>], layout: &Layout) -> Result<ExpertPlan, EplbError> {
        let layers = phy2log.len();
        let (e, p) = (layout.experts, layout.replicas);
        let mut logcnt = vec![0i64; layers * e];
        let mut phyrank = vec![0i64; layers * p];
        let mut flat = Vec::with_capacity(layers * p);
        for (l, row) in phy2log.iter().enumerate() {
            for (s, &x) in row.iter().enumerate() {
                phyrank[l * p + s] = logcnt[l * e + x];
                logcnt[l * e + x] += 1;
                flat.push(x as i64);
            }
        }
        let width = logcnt.iter().copied().max().unwrap_or(1).max(1) as usize;
        let mut log2phy = new_log2phy(layers, e, width)?;
        let buf = log2phy.as_mut_slice();
        for (l, row) in phy2log.iter().enumerate() {
            for (s, &x) in row.iter().enumerate() {
                buf[(l * e + x) * width + phyrank[l * p + s] as usize] = s as i64;
            }
        }
        let matrix = |cols: usize, data: Vec<i64>| {
            Matrix::from_flat(layers, cols, data).unwrap_or_else(|_| Matrix::filled(0, cols, 0))
        };
        Ok(ExpertPlan {
            policy: if layout.hierarchical() {
                Policy::Hierarchical
            } else {
                Policy::Global
            },
            num_groups: layout.groups,
            num_nodes: layout.nodes,
            num_gpus: layout.gpus,
            phy2log: matrix(p, flat),
            phyrank: matrix(p, phyrank),
            log2phy,
            logcnt: matrix(e, logcnt),
        })
    }

    /// The `phy2log` matrix as `usize` rows; `None` if an index is negative.
    pub fn phy2log_rows(&self) -> Option<Vec<Vec<usize>>> {
        self.phy2log
            .iter_rows()
            .map(|row| row.iter().map(|&e| usize::try_from(e).ok()).collect())
            .collect()
    }

    /// The layout the plan was made for.
    pub fn layout(&self) -> Layout {
        Layout::new(
            self.num_experts(),
            self.num_replicas(),
            self.num_groups,
            self.num_nodes,
            self.num_gpus,
        )
    }
}

/// A `[layers][experts][width]` `log2phy` filled with `-1`, refused above [`MAX_LOG2PHY`]
/// entries before allocating.
pub(crate) fn new_log2phy(
    layers: usize,
    experts: usize,
    width: usize,
) -> Result<Tensor3<i64>, EplbError> {
    let entries = layers.saturating_mul(experts).saturating_mul(width);
    if entries > MAX_LOG2PHY {
        return Err(EplbError::Log2phyTooLarge {
            entries,
            width,
            cap: MAX_LOG2PHY,
        });
    }
    Ok(Tensor3::filled(layers, experts, width, -1i64))
}
