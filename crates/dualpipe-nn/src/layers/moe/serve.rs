//! [`MoeLayer`]'s expert-parallel forward and input backward: the routed experts run on the
//! workers the [`ExpertPlacement`] names, reached by the group's all-to-alls; everything the
//! tokens' worker sums (gates, combine, input gradient) runs in the same order as without
//! expert parallelism.

use std::collections::HashMap;

use candle_core::{DType, Tensor};
use dualpipe_schedule::Chunk;

use super::parallel::{
    merge_replies, read_parts, split_rows, ExchangeTag, ExpertLink, ExpertPlacement, Phase,
    RowCounts,
};
use super::{device, host, MoeLayer, Routing};
use crate::error::{NnError, TensorContext};
use crate::layers::{Linear, Mlp, Param};

/// A worker's part in its group's expert parallelism for one MoE layer.
#[derive(Debug)]
pub struct ExpertParallel {
    link: Box<dyn ExpertLink>,
    placement: ExpertPlacement,
    /// Per chunk whose forward this worker served: per source, per expert, rows received.
    served: HashMap<Chunk, RowCounts>,
    /// Rows this worker's experts computed in forwards since the last reset.
    served_rows: u64,
    /// Whether an FB pair of the stage runs its two chunks overlapped.
    overlap: bool,
}

impl ExpertParallel {
    /// The part of the worker at `link`'s end, serving by `placement`.
    pub fn new(link: Box<dyn ExpertLink>, placement: ExpertPlacement) -> Result<Self, NnError> {
        if placement.workers != link.workers() {
            return Err(NnError::Config(format!(
                "an expert placement over {} workers for a group of {}",
                placement.workers,
                link.workers()
            )));
        }
        Ok(ExpertParallel {
            link,
            placement,
            served: HashMap::new(),
            served_rows: 0,
            overlap: true,
        })
    }

    /// The same part, with the overlap of a DualPipe FB pair's two chunks on (the default)
    /// or off (the pair runs its forward, then its backward).
    pub fn with_overlap(mut self, overlap: bool) -> Self {
        self.overlap = overlap;
        self
    }

    /// Whether an FB pair of a stage holding this layer overlaps its two chunks: while one
    /// waits on an all-to-all, the other computes (see [`super::overlap`]).
    pub fn overlap(&self) -> bool {
        self.overlap
    }

    /// The placement served.
    pub fn placement(&self) -> &ExpertPlacement {
        &self.placement
    }

    fn tag(&self, chunk: Chunk, phase: Phase) -> ExchangeTag {
        ExchangeTag {
            chunk,
            phase,
            version: self.placement.version,
        }
    }
}

/// Rows `rows` of `m` (`[n, width]`, host) gathered, flattened.
fn gather(m: &[f64], rows: &[u32], width: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows.len() * width);
    for &r in rows {
        let r = r as usize;
        out.extend_from_slice(&m[r * width..(r + 1) * width]);
    }
    out
}

impl MoeLayer {
    /// Serves this worker's placed experts from now on, freeing the routed experts the
    /// placement gives other workers (`None`: every expert here again, refused once one was
    /// freed). Refused while a chunk is in flight.
    pub fn set_expert_parallel(&mut self, parallel: Option<ExpertParallel>) -> Result<(), NnError> {
        if self.pending() != 0 {
            return Err(NnError::Stage(
                "the expert placement changes between steps only".into(),
            ));
        }
        match &parallel {
            Some(p) => {
                p.placement.check(self.experts.len())?;
                self.check_stored(&p.placement, p.link.worker())?;
            }
            None => {
                if let Some(j) = self.experts.iter().position(Option::is_none) {
                    return Err(NnError::Stage(format!(
                        "MoE: expert {j} was handed to another worker; the layer cannot serve \
                         every expert again"
                    )));
                }
            }
        }
        self.parallel = parallel;
        self.drop_unserved();
        Ok(())
    }

    /// Refuses `placement` when it gives `worker` an expert this layer does not store.
    fn check_stored(&self, placement: &ExpertPlacement, worker: usize) -> Result<(), NnError> {
        match (0..self.experts.len())
            .find(|&j| placement.serves(worker, j) && self.experts[j].is_none())
        {
            Some(j) => Err(NnError::Stage(format!(
                "placement version {} gives worker {worker} expert {j}, which it does not \
                 store; store the expert (weights and optimizer state) before re-placing",
                placement.version
            ))),
            None => Ok(()),
        }
    }

    /// Frees every routed expert the placement in force does not give this worker.
    fn drop_unserved(&mut self) {
        if let Some(p) = &self.parallel {
            let me = p.link.worker();
            for (j, e) in self.experts.iter_mut().enumerate() {
                if !p.placement.serves(me, j) {
                    *e = None;
                }
            }
        }
    }

    /// The routed experts this layer stores, ascending: every expert, or with expert
    /// parallelism those its placement gives this worker.
    pub fn stored_experts(&self) -> Vec<usize> {
        (0..self.experts.len())
            .filter(|&j| self.experts[j].is_some())
            .collect()
    }

    /// Routed expert `j`'s parameters (fc1's weight, then fc2's), `None` when not stored.
    pub fn expert_params(&self, j: usize) -> Option<Vec<&Param>> {
        self.experts.get(j)?.as_ref().map(Mlp::params)
    }

    /// Routed expert `j`'s parameters mutably, in the order of [`MoeLayer::expert_params`].
    pub fn expert_params_mut(&mut self, j: usize) -> Option<Vec<&mut Param>> {
        self.experts.get_mut(j)?.as_mut().map(Mlp::params_mut)
    }

    /// Stores routed expert `j` from its values (fc1's weight `[h, d]`, fc2's `[d, h]`), as
    /// received from a worker that holds it; its gradients start at zero. Between steps only.
    pub fn store_expert(&mut self, j: usize, values: Vec<Tensor>) -> Result<(), NnError> {
        if self.pending() != 0 {
            return Err(NnError::Stage(
                "an expert is stored between steps only".into(),
            ));
        }
        let slot = self
            .experts
            .get_mut(j)
            .ok_or_else(|| NnError::Config(format!("MoE: no routed expert {j} to store")))?;
        let [fc1, fc2]: [Tensor; 2] = values.try_into().map_err(|v: Vec<Tensor>| {
            NnError::Config(format!(
                "MoE: expert {j} takes 2 tensors (fc1, fc2), given {}",
                v.len()
            ))
        })?;
        *slot = Some(Mlp::from_layers(
            Linear::from_tensors(fc1, None)?,
            Linear::from_tensors(fc2, None)?,
        )?);
        Ok(())
    }

    /// The expert parallelism served, if any.
    pub fn expert_parallel(&self) -> Option<&ExpertParallel> {
        self.parallel.as_ref()
    }

    /// Replaces the placement (a rebalance; every worker of the group at the same step):
    /// refused unless this worker stores every expert it gives it (see
    /// [`MoeLayer::store_expert`]); the experts it no longer gives this worker are freed.
    pub fn set_placement(&mut self, placement: ExpertPlacement) -> Result<(), NnError> {
        placement.check(self.experts.len())?;
        if self.pending() != 0 {
            return Err(NnError::Stage(
                "the expert placement changes between steps only".into(),
            ));
        }
        let p = self
            .parallel
            .as_mut()
            .ok_or_else(|| NnError::Stage("the layer is not expert-parallel".into()))?;
        if placement.workers != p.placement.workers || placement.version < p.placement.version {
            return Err(NnError::Stage(format!(
                "placement version {} over {} workers cannot replace version {} over {}",
                placement.version, placement.workers, p.placement.version, p.placement.workers
            )));
        }
        let me = p.link.worker();
        self.check_stored(&placement, me)?;
        if let Some(p) = &mut self.parallel {
            p.placement = placement;
        }
        self.drop_unserved();
        Ok(())
    }

    /// Rows this worker's experts computed since the last [`MoeLayer::reset_counts`] (0
    /// without expert parallelism).
    pub fn served_rows(&self) -> u64 {
        self.parallel.as_ref().map_or(0, |p| p.served_rows)
    }

    pub(super) fn reset_served(&mut self) {
        if let Some(p) = &mut self.parallel {
            p.served_rows = 0;
        }
    }

    pub(super) fn parallel_pending(&self) -> usize {
        self.parallel.as_ref().map_or(0, |p| p.served.len())
    }

    /// The routed experts' outputs on this worker's rows (per expert, `None` when it has
    /// none), the experts computed where the placement puts them.
    pub(super) fn parallel_forward(
        &mut self,
        key: Chunk,
        x: &Tensor,
        routing: &Routing,
    ) -> Result<Vec<Option<Tensor>>, NnError> {
        let Some(mut p) = self.parallel.take() else {
            return Err(NnError::Stage("the layer is not expert-parallel".into()));
        };
        let result = self.forward_over(&mut p, key, x, routing);
        self.parallel = Some(p);
        result
    }

    fn forward_over(
        &mut self,
        p: &mut ExpertParallel,
        key: Chunk,
        x: &Tensor,
        routing: &Routing,
    ) -> Result<Vec<Option<Tensor>>, NnError> {
        let (dtype, width) = (x.dtype(), x.dim(1).ctx("MoE input")?);
        let me = p.link.worker();
        let e = self.experts.len();
        let xs = host(x, "MoE dispatch")?;
        let per_expert: Vec<Vec<f64>> =
            routing.rows.iter().map(|r| gather(&xs, r, width)).collect();
        let parts = split_rows(&p.placement, me, &per_expert, width);
        let got = p.link.all_to_all(p.tag(key, Phase::Dispatch), parts)?;
        let (counts, rows) = read_parts(&got, e, width)?;
        let mut replies: Vec<Vec<f64>> = vec![Vec::new(); got.len()];
        for j in 0..e {
            let total: usize = counts.iter().map(|c| c[j]).sum();
            if total == 0 {
                continue;
            }
            if !p.placement.serves(me, j) {
                return Err(NnError::Execution(format!(
                    "worker {me} was sent rows of expert {j}, which it does not serve"
                )));
            }
            let cat: Vec<f64> = rows.iter().flat_map(|r| r[j].iter().copied()).collect();
            let xj = device(cat, (total, width), dtype, "MoE dispatch")?;
            let out = host(
                &self.expert_mut(j)?.forward(key, &xj, None)?,
                "MoE expert output",
            )?;
            let mut at = 0;
            for (s, c) in counts.iter().enumerate() {
                replies[s].extend_from_slice(&out[at * width..(at + c[j]) * width]);
                at += c[j];
            }
            p.served_rows += total as u64;
        }
        p.served.insert(key, counts);
        let back = p.link.all_to_all(p.tag(key, Phase::Combine), replies)?;
        let lens: Vec<usize> = routing.rows.iter().map(Vec::len).collect();
        let merged = merge_replies(&p.placement, me, &lens, &back, width)?;
        merged
            .into_iter()
            .zip(&lens)
            .map(|(v, &n)| {
                (n > 0)
                    .then(|| device(v, (n, width), dtype, "MoE combine"))
                    .transpose()
            })
            .collect()
    }

    /// The input gradients of each routed expert on this worker's rows from their gated
    /// output gradients `gated[j]` (`None`: no rows); the experts this worker served run
    /// their input backward. Returns those gradients and the experts it served.
    pub(super) fn parallel_backward(
        &mut self,
        key: Chunk,
        gated: &[Option<Tensor>],
        width: usize,
        dtype: DType,
    ) -> Result<(Vec<Option<Tensor>>, Vec<usize>), NnError> {
        let Some(mut p) = self.parallel.take() else {
            return Err(NnError::Stage("the layer is not expert-parallel".into()));
        };
        let result = self.backward_over(&mut p, key, gated, width, dtype);
        self.parallel = Some(p);
        result
    }

    fn backward_over(
        &mut self,
        p: &mut ExpertParallel,
        key: Chunk,
        gated: &[Option<Tensor>],
        width: usize,
        dtype: DType,
    ) -> Result<(Vec<Option<Tensor>>, Vec<usize>), NnError> {
        let me = p.link.worker();
        let e = self.experts.len();
        let served = p.served.remove(&key).ok_or_else(|| {
            NnError::Stage(format!("MoE: backward_input of {key} before its forward"))
        })?;
        let per_expert = gated
            .iter()
            .map(|g| {
                g.as_ref()
                    .map_or(Ok(Vec::new()), |t| host(t, "MoE gated gradient"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let parts = split_rows(&p.placement, me, &per_expert, width);
        let got = p.link.all_to_all(p.tag(key, Phase::GradDispatch), parts)?;
        let (counts, rows) = read_parts(&got, e, width)?;
        if counts != served {
            return Err(NnError::Execution(format!(
                "MoE: the gradients of {key} came for other rows than its forward served"
            )));
        }
        let mut replies: Vec<Vec<f64>> = vec![Vec::new(); got.len()];
        let mut active = Vec::new();
        for j in 0..e {
            let total: usize = counts.iter().map(|c| c[j]).sum();
            if total == 0 {
                continue;
            }
            let cat: Vec<f64> = rows.iter().flat_map(|r| r[j].iter().copied()).collect();
            let doj = device(cat, (total, width), dtype, "MoE gradient dispatch")?;
            let dx = host(
                &self.expert_mut(j)?.backward_input(key, &doj)?,
                "MoE expert gradient",
            )?;
            let mut at = 0;
            for (s, c) in counts.iter().enumerate() {
                replies[s].extend_from_slice(&dx[at * width..(at + c[j]) * width]);
                at += c[j];
            }
            active.push(j);
        }
        let back = p.link.all_to_all(p.tag(key, Phase::GradCombine), replies)?;
        let lens: Vec<usize> = per_expert.iter().map(|v| v.len() / width.max(1)).collect();
        let merged = merge_replies(&p.placement, me, &lens, &back, width)?;
        let dx = merged
            .into_iter()
            .zip(&lens)
            .map(|(v, &n)| {
                (n > 0)
                    .then(|| device(v, (n, width), dtype, "MoE gradient combine"))
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((dx, active))
    }
}
