//! The mixture-of-experts feed-forward layer: a router (linear `d → E`, softmax), top-k
//! selection steered by DeepSeek-V3's auxiliary-loss-free bias, gates renormalised over the
//! chosen experts, routed experts and always-on shared experts (MLPs as in the dense block);
//! dropless (every token reaches its `k` experts). The backward is split as every layer's:
//! I through the experts, the gates and the softmax; W for router and expert weights.

pub mod router;
mod serve;

/// The expert-parallel exchange, the FB pair's compute token and the wait tallies live beside
/// the layers, in [`crate::parallel`]; re-exported here under their old names.
pub use crate::parallel::{experts as parallel, overlap, waits};

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use dualpipe_schedule::Chunk;

use crate::error::{NnError, TensorContext};
use crate::layers::{tensor_bytes, Linear, Mlp, Param};
use crate::precision::Half;
pub use router::Routing;
pub use serve::ExpertParallel;

/// The MoE part of the architecture (stored in [`crate::gpt::GptConfig::moe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    /// Routed experts per MoE block.
    pub experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Hidden width of every expert's MLP (routed and shared).
    pub expert_hidden: usize,
    /// Shared experts every token passes through (0 for none).
    pub shared_experts: usize,
    /// Every `every`-th block is an MoE block (blocks `every-1, 2·every-1, ...`); 1: all.
    pub every: usize,
}

impl MoeConfig {
    /// Whether block `l` has the MoE feed-forward.
    pub fn is_moe_block(&self, l: usize) -> bool {
        self.every > 0 && l % self.every == self.every - 1
    }

    /// Checks the sizes: experts, `top_k` (at most `experts`), `expert_hidden`, `every`
    /// positive.
    pub fn validate(&self) -> Result<(), NnError> {
        for (name, v) in [
            ("experts", self.experts),
            ("top_k", self.top_k),
            ("expert_hidden", self.expert_hidden),
            ("moe_every", self.every),
        ] {
            if v == 0 {
                return Err(NnError::Config(format!("{name} must be at least 1")));
            }
        }
        if self.top_k > self.experts {
            return Err(NnError::Config(format!(
                "top_k ({}) is more than the experts ({}); choose at most {}",
                self.top_k, self.experts, self.experts
            )));
        }
        Ok(())
    }
}

/// What a chunk's forward leaves for its backward.
#[derive(Debug)]
struct Saved {
    routing: Routing,
    /// Per routed expert: its output on its rows (before the gates), when it had rows.
    outputs: Vec<Option<Tensor>>,
}

/// `y = residual + Σ_{j ∈ top-k} gⱼ · expertⱼ(x) + Σₛ sharedₛ(x)`.
#[derive(Debug)]
pub struct MoeLayer {
    router: Linear,
    bias: Vec<f64>,
    /// The routed experts this layer stores (`None`: another worker of the expert-parallel
    /// group holds it; see [`MoeLayer::stored_experts`]).
    experts: Vec<Option<Mlp>>,
    shared: Vec<Mlp>,
    top_k: usize,
    /// Coefficient of the auxiliary loss times its scale (0: off).
    aux: f64,
    saved: HashMap<Chunk, Saved>,
    /// Per chunk after its input backward: the routed experts that had rows.
    active: HashMap<Chunk, Vec<usize>>,
    counts: Vec<u64>,
    /// With expert parallelism: this worker's group and the experts it serves.
    parallel: Option<ExpertParallel>,
}

fn not_stored(j: usize) -> NnError {
    NnError::Stage(format!(
        "MoE: routed expert {j} is not stored on this worker (its placement gives it to \
         another)"
    ))
}

fn host(t: &Tensor, what: &str) -> Result<Vec<f64>, NnError> {
    t.to_dtype(DType::F64)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f64>())
        .ctx(what)
}

fn device(v: Vec<f64>, shape: (usize, usize), dtype: DType, what: &str) -> Result<Tensor, NnError> {
    Tensor::from_vec(v, shape, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .ctx(what)
}

impl MoeLayer {
    /// Computes the experts in mixed precision with `half` (their GEMMs and saved tensors),
    /// or in the weights' dtype with `None`; the router stays in the weights' dtype, so the
    /// routing decisions see full-precision scores.
    pub fn set_half(&mut self, half: Option<Half>) -> Result<(), NnError> {
        for mlp in self.experts.iter_mut().flatten().chain(&mut self.shared) {
            mlp.set_half(half)?;
        }
        Ok(())
    }

    /// The layer from its router (`d → E`), selection bias (`E`), routed experts (`E`) and
    /// shared experts, routing each token to `top_k` experts.
    pub fn new(
        router: Linear,
        selection_bias: Vec<f64>,
        experts: Vec<Mlp>,
        shared: Vec<Mlp>,
        top_k: usize,
    ) -> Result<Self, NnError> {
        let e = router.output_dim();
        if experts.len() != e || selection_bias.len() != e || top_k == 0 || top_k > e {
            return Err(NnError::Config(format!(
                "MoE layer: router for {e} experts, {} experts, {} biases, top_k {top_k}",
                experts.len(),
                selection_bias.len()
            )));
        }
        Ok(MoeLayer {
            router,
            bias: selection_bias,
            experts: experts.into_iter().map(Some).collect(),
            shared,
            top_k,
            aux: 0.0,
            saved: HashMap::new(),
            active: HashMap::new(),
            counts: vec![0; e],
            parallel: None,
        })
    }

    /// Turns the auxiliary balance loss on with coefficient `coef`, its gradient scaled by
    /// `scale` (the stage's `1 / micro_batches`); 0 turns it off.
    pub fn set_aux_loss(&mut self, coef: f64, scale: f64) {
        self.aux = coef * scale;
    }

    /// Routed experts.
    pub fn experts(&self) -> usize {
        self.experts.len()
    }

    /// Router weight, then each stored routed expert's fc1 and fc2 (every expert unless the
    /// layer is expert-parallel), then each shared expert's.
    pub fn params(&self) -> Vec<&Param> {
        let mut p = self.router.params();
        p.extend(self.experts.iter().flatten().flat_map(Mlp::params));
        p.extend(self.shared.iter().flat_map(Mlp::params));
        p
    }

    /// The parameters mutably, in the order of [`MoeLayer::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.router.params_mut();
        p.extend(self.experts.iter_mut().flatten().flat_map(Mlp::params_mut));
        p.extend(self.shared.iter_mut().flat_map(Mlp::params_mut));
        p
    }

    /// The selection bias (added to the probabilities for top-k selection only).
    pub fn selection_bias(&self) -> &[f64] {
        &self.bias
    }

    /// Replaces the selection bias (a checkpoint's); refused unless it has one value per
    /// routed expert.
    pub fn set_selection_bias(&mut self, bias: &[f64]) -> Result<(), NnError> {
        if bias.len() != self.bias.len() {
            return Err(NnError::Config(format!(
                "a selection bias of {} values for {} experts",
                bias.len(),
                self.bias.len()
            )));
        }
        self.bias.copy_from_slice(bias);
        Ok(())
    }

    /// Tokens routed to each expert by forwards since the last [`MoeLayer::reset_counts`].
    pub fn token_counts(&self) -> &[u64] {
        &self.counts
    }

    /// Zeroes the token counts.
    pub fn reset_counts(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.reset_served();
    }

    /// The auxiliary-loss-free step: `bⱼ += rate · sign(mean − loadⱼ)` from `loads` (the
    /// step's counts summed over every copy of the layer, so the copies stay equal).
    pub fn update_selection_bias(&mut self, loads: &[u64], rate: f64) -> Result<(), NnError> {
        if loads.len() != self.bias.len() {
            return Err(NnError::Config(format!(
                "{} loads for {} experts",
                loads.len(),
                self.bias.len()
            )));
        }
        router::update_bias(&mut self.bias, loads, rate);
        Ok(())
    }

    /// The routing of rows `x` (`[n, d]`) by the current router and bias.
    pub fn route(&self, x: &Tensor) -> Result<Routing, NnError> {
        let logits = host(&self.router.apply(x)?, "MoE router")?;
        Ok(router::route(
            &logits,
            self.experts.len(),
            self.top_k,
            &self.bias,
        ))
    }

    /// Routed expert `j`, refused when this worker does not store it.
    fn expert(&self, j: usize) -> Result<&Mlp, NnError> {
        self.experts
            .get(j)
            .and_then(Option::as_ref)
            .ok_or_else(|| not_stored(j))
    }

    fn expert_mut(&mut self, j: usize) -> Result<&mut Mlp, NnError> {
        self.experts
            .get_mut(j)
            .and_then(Option::as_mut)
            .ok_or_else(|| not_stored(j))
    }

    fn index(rows: &[u32]) -> Result<Tensor, NnError> {
        Tensor::from_slice(rows, rows.len(), &Device::Cpu).ctx("MoE rows")
    }

    fn gate_column(routing: &Routing, j: usize, dtype: DType) -> Result<Tensor, NnError> {
        let g: Vec<f64> = routing.slots[j].iter().map(|&s| routing.gates[s]).collect();
        device(g, (routing.slots[j].len(), 1), dtype, "MoE gates")
    }

    /// Sums the gated expert outputs into `y`.
    fn combine(
        y: Tensor,
        routing: &Routing,
        outputs: &[Option<Tensor>],
        dtype: DType,
    ) -> Result<Tensor, NnError> {
        let mut y = y;
        for (j, o) in outputs.iter().enumerate() {
            if let Some(o) = o {
                let gated = o
                    .broadcast_mul(&Self::gate_column(routing, j, dtype)?)
                    .ctx("MoE gating")?;
                y = y
                    .index_add(&Self::index(&routing.rows[j])?, &gated, 0)
                    .ctx("MoE combine")?;
            }
        }
        Ok(y)
    }

    /// `moe(x) (+ residual)` without saving or counting anything.
    pub fn apply(&self, x: &Tensor, residual: Option<&Tensor>) -> Result<Tensor, NnError> {
        let routing = self.route(x)?;
        let mut y = match residual {
            Some(r) => r.clone(),
            None => x.zeros_like().ctx("MoE output")?,
        };
        for s in &self.shared {
            y = s.apply(x, Some(&y))?;
        }
        let outputs = (0..self.experts.len())
            .zip(&routing.rows)
            .map(|(j, rows)| {
                (!rows.is_empty())
                    .then(|| {
                        let xj = x.index_select(&Self::index(rows)?, 0).ctx("MoE dispatch")?;
                        self.expert(j)?.apply(&xj, None)
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::combine(y, &routing, &outputs, x.dtype())
    }

    /// `moe(x) (+ residual)`, saving what the chunk's backward needs and counting the tokens
    /// each expert received.
    pub fn forward(
        &mut self,
        key: Chunk,
        x: &Tensor,
        residual: Option<&Tensor>,
    ) -> Result<Tensor, NnError> {
        let logits = host(&self.router.forward(key, x)?, "MoE router")?;
        let routing = router::route(&logits, self.experts.len(), self.top_k, &self.bias);
        let mut y = match residual {
            Some(r) => r.clone(),
            None => x.zeros_like().ctx("MoE output")?,
        };
        for s in &mut self.shared {
            y = s.forward(key, x, Some(&y))?;
        }
        let outputs = if self.parallel.is_some() {
            self.parallel_forward(key, x, &routing)?
        } else {
            let mut outputs = Vec::with_capacity(self.experts.len());
            for (j, rows) in routing.rows.iter().enumerate() {
                outputs.push(if rows.is_empty() {
                    None
                } else {
                    let xj = x.index_select(&Self::index(rows)?, 0).ctx("MoE dispatch")?;
                    Some(self.expert_mut(j)?.forward(key, &xj, None)?)
                });
            }
            outputs
        };
        let y = Self::combine(y, &routing, &outputs, x.dtype())?;
        for (c, n) in self.counts.iter_mut().zip(routing.counts()) {
            *c += n;
        }
        self.saved.insert(key, Saved { routing, outputs });
        Ok(y)
    }

    /// The input gradient through the experts, the gates and the router (weight gradients
    /// wait for [`MoeLayer::backward_weight`]).
    pub fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
        let Saved { routing, outputs } = self.saved.remove(&key).ok_or_else(|| {
            NnError::Stage(format!("MoE: backward_input of {key} before its forward"))
        })?;
        let dtype = dy.dtype();
        let mut dx = dy.zeros_like().ctx("MoE input gradient")?;
        for s in &mut self.shared {
            dx = (dx + s.backward_input(key, dy)?).ctx("MoE shared gradient")?;
        }
        let mut gate_grads = vec![0.0; routing.tokens * routing.top_k];
        let mut gated = Vec::with_capacity(outputs.len());
        for (j, o) in outputs.iter().enumerate() {
            let Some(o) = o else {
                gated.push(None);
                continue;
            };
            let idx = Self::index(&routing.rows[j])?;
            let dyj = dy.index_select(&idx, 0).ctx("MoE gradient dispatch")?;
            let dg = host(
                &(&dyj * o).and_then(|t| t.sum(1)).ctx("MoE gate gradient")?,
                "MoE gate gradient",
            )?;
            for (&s, g) in routing.slots[j].iter().zip(dg) {
                gate_grads[s] = g;
            }
            gated.push(Some(
                dyj.broadcast_mul(&Self::gate_column(&routing, j, dtype)?)
                    .ctx("MoE gated gradient")?,
            ));
        }
        let (input_grads, active) = if self.parallel.is_some() {
            self.parallel_backward(key, &gated, dy.dim(1).ctx("MoE gradient")?, dtype)?
        } else {
            let mut grads = Vec::with_capacity(gated.len());
            let mut active = Vec::new();
            for (j, g) in gated.iter().enumerate() {
                grads.push(match g {
                    Some(doj) => {
                        active.push(j);
                        Some(self.expert_mut(j)?.backward_input(key, doj)?)
                    }
                    None => None,
                });
            }
            (grads, active)
        };
        for (j, dxj) in input_grads.iter().enumerate() {
            if let Some(dxj) = dxj {
                let idx = Self::index(&routing.rows[j])?;
                dx = dx.index_add(&idx, dxj, 0).ctx("MoE gradient combine")?;
            }
        }
        let ds = device(
            routing.logit_grads(&gate_grads, self.aux),
            (routing.tokens, routing.experts),
            dtype,
            "MoE router gradient",
        )?;
        let dx = self.router.backward_input_plus(key, &ds, Some(&dx))?;
        self.active.insert(key, active);
        Ok(dx)
    }

    /// The router's and the experts' weight gradients of the chunk.
    pub fn backward_weight(&mut self, key: Chunk) -> Result<(), NnError> {
        let active = self.active.remove(&key).ok_or_else(|| {
            NnError::Stage(format!(
                "MoE: backward_weight of {key} before its backward_input"
            ))
        })?;
        self.router.backward_weight(key)?;
        for j in active {
            self.expert_mut(j)?.backward_weight(key)?;
        }
        for s in &mut self.shared {
            s.backward_weight(key)?;
        }
        Ok(())
    }

    /// Saved per-chunk state not yet consumed.
    pub fn pending(&self) -> usize {
        self.saved.len()
            + self.active.len()
            + self.parallel_pending()
            + self.router.pending()
            + self
                .experts
                .iter()
                .flatten()
                .map(Mlp::pending)
                .sum::<usize>()
            + self.shared.iter().map(Mlp::pending).sum::<usize>()
    }

    /// Bytes of the saved tensors (expert outputs and its layers' saved tensors).
    pub fn saved_bytes(&self) -> usize {
        self.saved
            .values()
            .flat_map(|s| s.outputs.iter().flatten())
            .map(tensor_bytes)
            .sum::<usize>()
            + self.router.saved_bytes()
            + self
                .experts
                .iter()
                .flatten()
                .map(Mlp::saved_bytes)
                .sum::<usize>()
            + self.shared.iter().map(Mlp::saved_bytes).sum::<usize>()
    }
}
