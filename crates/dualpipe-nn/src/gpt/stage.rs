//! [`GptStage`]: one pipeline stage of the GPT model, implementing the runtime's [`Stage`].

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use candle_core::Tensor;
use dualpipe_runtime::{ForwardInput, ForwardOutput};
use dualpipe_schedule::Chunk;
use dualpipe_schedule::Recompute;

use super::weights::{block_buffer_names, block_tensor_names, expert_prefix, moe_bias_name};
use super::{stage_layers, Block, GptConfig, GptWeights, MoeLayer};
use crate::error::NnError;
use crate::layers::{
    cross_entropy, restore, store, tensor_bytes, Embedding, Linear, Param, RmsNorm,
};
use crate::model_stage::{ModelStage, StagePosition};
use crate::plumbing::{self, ForwardStart};
use crate::precision::Half;

/// One micro-batch of token sequences: `rows` sequences of `seq` input ids and, shifted by
/// one byte, their `seq` target ids (row-major).
#[derive(Clone, Debug)]
pub struct TokenMicroBatch {
    /// Input ids, `rows·seq`.
    pub inputs: Arc<[u32]>,
    /// Next-token targets, `rows·seq`.
    pub targets: Arc<[u32]>,
    /// Sequences in the micro-batch.
    pub rows: usize,
    /// Tokens per sequence.
    pub seq: usize,
}

/// Every micro-batch of one step, indexed by global micro-batch.
pub type TokenBatch = Arc<Vec<TokenMicroBatch>>;

/// One copy of a model stage of the GPT: stage 0 holds the embeddings, the last stage the
/// final norm and the LM head, and stage `s` of `stages` holds blocks
/// `s·L/stages .. (s+1)·L/stages`.
///
/// Between stages travel hidden states `[rows·seq, d]`; stage 0's input is the micro-batch's
/// token ids, loaded from the step's [`TokenBatch`]. The last stage returns the mean
/// next-token cross-entropy as [`ForwardOutput::Loss`]; its gradient is scaled by
/// `1 / micro_batches` so the step's gradient is that of the mean loss. Weight gradients are
/// computed only in [`Stage::backward_weight`](dualpipe_runtime::Stage::backward_weight) and accumulate over the step.
#[derive(Debug)]
pub struct GptStage {
    config: GptConfig,
    stages: usize,
    position: StagePosition,
    layers: Range<usize>,
    embedding: Option<Embedding>,
    blocks: Vec<Block>,
    head: Option<(RmsNorm, Linear)>,
    batch: Option<TokenBatch>,
    /// Last stage: the loss gradient of each chunk whose forward ran.
    loss_grads: HashMap<Chunk, Tensor>,
    /// Per chunk: the sequence length (blocks need it).
    seqs: HashMap<Chunk, usize>,
    /// What the blocks' forwards keep.
    recompute: Recompute,
    /// The half-precision format under mixed precision (`None`: the weights' dtype).
    half: Option<Half>,
    /// What the loss gradient is multiplied by (1 but under f16 loss scaling).
    loss_scale: f64,
    /// The MoE auxiliary loss's coefficient ([`GptStage::set_aux_loss`]).
    aux_coef: f64,
}

impl GptStage {
    /// The copy of model stage `position.model_stage` (of `stages`) serving direction
    /// `position.dir`, with its tensors taken from `weights`.
    pub fn new(
        weights: &GptWeights,
        stages: usize,
        position: StagePosition,
    ) -> Result<Self, NnError> {
        let layers = stage_layers(weights.config().layers, stages, position.model_stage)?;
        Self::with_layers(weights, stages, position, layers)
    }

    /// The copy of model stage `position.model_stage` (of `stages`) holding the blocks
    /// `layers` (any contiguous run, possibly empty: uneven partitions), serving direction
    /// `position.dir`, with its tensors taken from `weights`.
    pub fn with_layers(
        weights: &GptWeights,
        stages: usize,
        position: StagePosition,
        layers: Range<usize>,
    ) -> Result<Self, NnError> {
        let config = *weights.config();
        if layers.start > layers.end || layers.end > config.layers || position.model_stage >= stages
        {
            return Err(NnError::Config(format!(
                "stage {} of {stages} cannot hold blocks {}..{} of a model of {} blocks",
                position.model_stage, layers.start, layers.end, config.layers
            )));
        }
        if position.micro_batches == 0 || position.micro_batches_per_dir == 0 {
            return Err(NnError::Config(
                "a step needs at least one micro-batch".into(),
            ));
        }
        let first = position.model_stage == 0;
        let last = position.model_stage + 1 == stages;
        let embedding = first
            .then(|| {
                Embedding::from_tensors(
                    weights.get("tok_emb.weight")?.clone(),
                    weights.get("pos_emb.weight")?.clone(),
                )
            })
            .transpose()?;
        let blocks = layers
            .clone()
            .map(|l| Block::from_weights(weights, l))
            .collect::<Result<Vec<_>, _>>()?;
        let head = last
            .then(|| -> Result<_, NnError> {
                Ok((
                    RmsNorm::from_tensor(weights.get("norm_f.weight")?.clone())?,
                    Linear::from_tensors(weights.get("lm_head.weight")?.clone(), None)?,
                ))
            })
            .transpose()?;
        Ok(GptStage {
            config,
            stages,
            position,
            layers,
            embedding,
            blocks,
            head,
            batch: None,
            loss_grads: HashMap::new(),
            seqs: HashMap::new(),
            recompute: Recompute::None,
            half: None,
            loss_scale: 1.0,
            aux_coef: 0.0,
        })
    }

    /// The whole model as one stage (first and last), for sequential runs, eval and
    /// generation.
    pub fn whole(weights: &GptWeights) -> Result<Self, NnError> {
        Self::new(
            weights,
            1,
            StagePosition {
                dir: 0,
                model_stage: 0,
                micro_batches: 1,
                micro_batches_per_dir: 1,
            },
        )
    }

    /// What the blocks' forwards keep from now on (set it between steps); the embeddings
    /// and the head always save. See [`Block`] (MoE blocks always save).
    pub fn set_recompute(&mut self, recompute: Recompute) {
        self.recompute = recompute;
        for block in &mut self.blocks {
            block.set_recompute(recompute);
        }
    }

    /// Computes in mixed precision with `half`, or in the weights' dtype with `None` (set it
    /// between steps). Under mixed precision the weights stay f32 (the master copy the
    /// optimizer updates); the feed-forward GEMMs (the dense MLP's, the experts') read their
    /// operands in `half` and accumulate in f32, the tensors the blocks keep for their
    /// backward are held in `half`, and so are the activations and gradients this stage sends
    /// to its neighbours. As DeepSeek-V3 keeps its embedding, output head, gating, norms and
    /// attention in higher precision, the embeddings, the attention's projections (unless
    /// [`GptStage::set_half_projections`]) and softmax,
    /// the norms, the MoE router, the output head and the loss compute in f32.
    pub fn set_half(&mut self, half: Option<Half>) -> Result<(), NnError> {
        for block in &mut self.blocks {
            block.set_half(half)?;
        }
        self.half = half;
        Ok(())
    }

    /// Runs the attention projections' GEMMs in the mixed-precision format as well, as
    /// PyTorch's autocast does (`false`, the default: they stay f32, which keeps the default
    /// task's validation loss within 0.1% of f32's; see
    /// [`CausalSelfAttention::set_half_projections`](crate::layers::CausalSelfAttention::set_half_projections)).
    pub fn set_half_projections(&mut self, on: bool) -> Result<(), NnError> {
        self.blocks
            .iter_mut()
            .try_for_each(|block| block.set_half_projections(on))
    }

    /// The half-precision format under mixed precision, if on.
    pub fn half(&self) -> Option<Half> {
        self.half
    }

    /// What the blocks' forwards keep (see [`GptStage::set_recompute`]).
    pub fn recompute(&self) -> Recompute {
        self.recompute
    }

    /// The architecture.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// Where this copy sits.
    pub fn position(&self) -> StagePosition {
        self.position
    }

    /// The model stage index.
    pub fn model_stage(&self) -> usize {
        self.position.model_stage
    }

    /// The direction this copy serves.
    pub fn dir(&self) -> usize {
        self.position.dir
    }

    /// Whether this stage holds the embeddings (and loads token ids).
    pub fn is_first(&self) -> bool {
        self.position.model_stage == 0
    }

    /// Whether this stage holds the final norm and the head (and computes the loss).
    pub fn is_last(&self) -> bool {
        self.position.model_stage + 1 == self.stages
    }

    /// Gives the stage the step's micro-batches: the first stage reads the ids, the last the
    /// targets, every stage the sequence length (set it on every stage before the step).
    pub fn set_batch(&mut self, batch: TokenBatch) {
        self.batch = Some(batch);
    }

    /// The names of this stage's tensors, in the order of [`GptStage::params`].
    pub fn param_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        if self.embedding.is_some() {
            names.push("tok_emb.weight".to_string());
            names.push("pos_emb.weight".to_string());
        }
        for (l, block) in self.layers.clone().zip(&self.blocks) {
            let freed = block.moe().map_or_else(Vec::new, |m| {
                let stored = m.stored_experts();
                (0..m.experts())
                    .filter(|j| !stored.contains(j))
                    .map(|j| expert_prefix(l, j))
                    .collect()
            });
            names.extend(
                block_tensor_names(l, &self.config)
                    .into_iter()
                    .map(|(n, _)| n)
                    .filter(|n| !freed.iter().any(|f| n.starts_with(f.as_str()))),
            );
        }
        if self.head.is_some() {
            names.push("norm_f.weight".into());
            names.push("lm_head.weight".into());
        }
        names
    }

    /// Per parameter (in the order of [`GptStage::params`]): whether it is a routed expert
    /// of an expert-parallel MoE block, stored only by the workers its placement gives it
    /// (its gradient is summed among those, not by the data-parallel exchange).
    pub fn sharded_params(&self) -> Vec<bool> {
        let parallel: Vec<String> = self
            .moe_layers()
            .into_iter()
            .filter(|(_, m)| m.expert_parallel().is_some())
            .map(|(l, _)| format!("blocks.{l}.moe.experts."))
            .collect();
        self.param_names()
            .iter()
            .map(|n| parallel.iter().any(|p| n.starts_with(p.as_str())))
            .collect()
    }

    /// Parameters in the model's fixed order (a slice of [`super::tensor_names`]; with
    /// expert parallelism only the routed experts this worker stores).
    pub fn params(&self) -> Vec<&Param> {
        let mut p: Vec<&Param> = self.embedding.iter().flat_map(Embedding::params).collect();
        p.extend(self.blocks.iter().flat_map(Block::params));
        if let Some((norm, head)) = &self.head {
            p.extend(norm.params());
            p.extend(head.params());
        }
        p
    }

    /// The parameters mutably, in the order of [`GptStage::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p: Vec<&mut Param> = self
            .embedding
            .iter_mut()
            .flat_map(Embedding::params_mut)
            .collect();
        p.extend(self.blocks.iter_mut().flat_map(Block::params_mut));
        if let Some((norm, head)) = &mut self.head {
            p.extend(norm.params_mut());
            p.extend(head.params_mut());
        }
        p
    }

    /// Resets every accumulated gradient, and the MoE layers' token counts, to zero (call
    /// before each step).
    pub fn zero_grad(&mut self) -> Result<(), NnError> {
        for block in &mut self.blocks {
            if let Some(m) = block.moe_mut() {
                m.reset_counts();
            }
        }
        self.params_mut().into_iter().try_for_each(Param::zero_grad)
    }

    /// Copies this stage's current parameter values, and its MoE selection biases, into
    /// `weights` (by name).
    pub fn write_into(&self, weights: &mut GptWeights) -> Result<(), NnError> {
        for (name, p) in self.param_names().iter().zip(self.params()) {
            weights.set(name, p.value.clone())?;
        }
        for (l, block) in self.layers.clone().zip(&self.blocks) {
            if let Some(m) = block.moe() {
                let bias = Tensor::new(m.selection_bias(), &candle_core::Device::Cpu)
                    .map_err(|e| NnError::tensor("the selection bias", e))?;
                weights.set(&moe_bias_name(l), bias)?;
            }
        }
        Ok(())
    }

    /// The names of this stage's buffers (the MoE selection biases), written by
    /// [`GptStage::write_into`] beside the parameters.
    pub fn buffer_names(&self) -> Vec<String> {
        self.layers
            .clone()
            .flat_map(|l| block_buffer_names(l, &self.config))
            .map(|(n, _)| n)
            .collect()
    }

    /// Per MoE block of this stage: its model-wide index and the tokens its forwards routed
    /// to each expert since the last [`GptStage::zero_grad`].
    pub fn router_counts(&self) -> Vec<(usize, Vec<u64>)> {
        self.layers
            .clone()
            .zip(&self.blocks)
            .filter_map(|(l, b)| b.moe().map(|m| (l, m.token_counts().to_vec())))
            .collect()
    }

    /// The auxiliary-loss-free bias step of MoE block `layer` (model-wide index) from
    /// `loads`, the step's counts over every copy of the block.
    pub fn update_selection_bias(
        &mut self,
        layer: usize,
        loads: &[u64],
        rate: f64,
    ) -> Result<(), NnError> {
        let i = layer
            .checked_sub(self.layers.start)
            .filter(|&i| i < self.blocks.len())
            .ok_or_else(|| NnError::Stage(format!("block {layer} is not in this stage")))?;
        self.blocks[i]
            .moe_mut()
            .ok_or_else(|| NnError::Stage(format!("block {layer} has no MoE layer")))?
            .update_selection_bias(loads, rate)
    }

    /// The MoE selection biases of this stage, each under its name
    /// (`blocks.{l}.moe.router.selection_bias`, as [`GptStage::buffer_names`]): model state
    /// beside the parameters, saved in checkpoints.
    pub fn selection_biases(&self) -> Vec<(String, Vec<f64>)> {
        self.moe_layers()
            .into_iter()
            .map(|(l, m)| (moe_bias_name(l), m.selection_bias().to_vec()))
            .collect()
    }

    /// Sets the selection bias named `name` (one of [`GptStage::selection_biases`]) to `bias`
    /// (a checkpoint's).
    pub fn set_selection_bias(&mut self, name: &str, bias: &[f64]) -> Result<(), NnError> {
        let layers = self.layers.clone();
        let block = layers
            .zip(&mut self.blocks)
            .find(|(l, b)| b.moe().is_some() && moe_bias_name(*l) == name)
            .map(|(_, b)| b)
            .ok_or_else(|| NnError::Stage(format!("this stage has no selection bias `{name}`")))?;
        block
            .moe_mut()
            .ok_or_else(|| NnError::Stage(format!("`{name}` is not an MoE layer's")))?
            .set_selection_bias(bias)
    }

    /// Turns the MoE layers' auxiliary balance loss on with coefficient `coef` (0: off); its
    /// gradient is scaled by `1 / micro_batches` as the cross-entropy's is.
    pub fn set_aux_loss(&mut self, coef: f64) {
        self.aux_coef = coef;
        let scale = self.loss_scale / self.position.micro_batches as f64;
        for block in &mut self.blocks {
            if let Some(m) = block.moe_mut() {
                m.set_aux_loss(coef, scale);
            }
        }
    }

    /// The MoE blocks of this stage (model-wide index, layer).
    pub fn moe_layers(&self) -> Vec<(usize, &MoeLayer)> {
        self.layers
            .clone()
            .zip(&self.blocks)
            .filter_map(|(l, b)| b.moe().map(|m| (l, m)))
            .collect()
    }

    /// The MoE blocks of this stage mutably (model-wide index, layer): e.g. to give them
    /// their expert parallelism ([`MoeLayer::set_expert_parallel`]).
    pub fn moe_layers_mut(&mut self) -> Vec<(usize, &mut MoeLayer)> {
        self.layers
            .clone()
            .zip(&mut self.blocks)
            .filter_map(|(l, b)| b.moe_mut().map(|m| (l, m)))
            .collect()
    }

    /// Whether an FB pair with this stage in it overlaps its two chunks: some MoE block is
    /// expert-parallel with the overlap on ([`crate::layers::moe::ExpertParallel::overlap`]).
    pub fn overlaps_expert_traffic(&self) -> bool {
        self.moe_layers()
            .iter()
            .any(|(_, m)| m.expert_parallel().is_some_and(|p| p.overlap()))
    }

    /// Saved tensors of chunks whose backward has not run yet; 0 after a complete step.
    pub fn pending(&self) -> usize {
        self.loss_grads.len()
            + self.seqs.len()
            + self.embedding.as_ref().map_or(0, Embedding::pending)
            + self.blocks.iter().map(Block::pending).sum::<usize>()
            + self
                .head
                .as_ref()
                .map_or(0, |(n, h)| n.pending() + h.pending())
    }

    /// Bytes of the tensors saved for chunks whose backward has not finished (activations
    /// kept between a forward and its input and weight backward, and the loss gradients);
    /// 0 after a complete step. The token ids, shared with the step's batch, are not counted.
    pub fn saved_bytes(&self) -> usize {
        self.loss_grads.values().map(tensor_bytes).sum::<usize>()
            + self.embedding.as_ref().map_or(0, Embedding::saved_bytes)
            + self.blocks.iter().map(Block::saved_bytes).sum::<usize>()
            + self
                .head
                .as_ref()
                .map_or(0, |(n, h)| n.saved_bytes() + h.saved_bytes())
    }

    /// The logits `[rows·seq, 256]` of `rows` sequences of `seq` ids, without saving
    /// anything; only for a stage holding the whole model ([`GptStage::whole`]).
    pub fn logits(&self, ids: &[u32], seq: usize) -> Result<Tensor, NnError> {
        let (Some(emb), Some((norm, head))) = (&self.embedding, &self.head) else {
            return Err(NnError::Config(
                "logits need the whole model in one stage".into(),
            ));
        };
        let mut h = emb.apply(ids, seq)?;
        for block in &self.blocks {
            h = block.apply(&h, seq)?;
        }
        head.apply(&norm.apply(&h)?)
    }

    fn micro_batch(&self, chunk: Chunk) -> Result<&TokenMicroBatch, NnError> {
        plumbing::micro_batch(
            self.position,
            self.batch.as_deref().map(Vec::as_slice),
            chunk,
        )
    }

    fn forward_impl(
        &mut self,
        chunk: Chunk,
        input: ForwardInput<Tensor>,
    ) -> Result<ForwardOutput<Tensor>, NnError> {
        plumbing::check_chunk(self.position, chunk, "forward")?;
        // Every stage reads the sequence length from the batch (blocks need it to split rows).
        let seq = self.micro_batch(chunk)?.seq;
        let mut h = match plumbing::forward_start(self.position, self.is_first(), chunk, input)? {
            ForwardStart::MicroBatch => {
                let ids = self.micro_batch(chunk)?.inputs.clone();
                let emb = self
                    .embedding
                    .as_mut()
                    .ok_or_else(|| NnError::Stage("the first stage has no embeddings".into()))?;
                emb.forward(chunk, ids, seq)?
            }
            ForwardStart::Activation(x) => restore(&x)?,
        };
        for block in &mut self.blocks {
            h = block.forward(chunk, &h, seq)?;
        }
        self.seqs.insert(chunk, seq);
        if let Some((norm, head)) = &mut self.head {
            let hn = norm.forward(chunk, &h)?;
            let logits = head.forward(chunk, &hn)?;
            let scale = self.loss_scale / self.position.micro_batches as f64;
            let targets = self.micro_batch(chunk)?.targets.clone();
            let (loss, grad) = cross_entropy(&logits, &targets, scale)?;
            self.loss_grads.insert(chunk, grad);
            Ok(ForwardOutput::Loss(loss))
        } else {
            Ok(ForwardOutput::Activation(store(&h, self.half)?))
        }
    }

    fn backward_input_impl(
        &mut self,
        chunk: Chunk,
        grad_output: Option<Tensor>,
    ) -> Result<Option<Tensor>, NnError> {
        plumbing::check_chunk(self.position, chunk, "backward_input")?;
        let before = || NnError::Stage(format!("backward_input of {chunk} before its forward"));
        let start = plumbing::backward_start(self.is_last(), chunk, grad_output)?;
        let mut g = match (start, &mut self.head) {
            (Some(g), _) => restore(&g)?,
            (None, Some((norm, head))) => {
                let dl = self.loss_grads.remove(&chunk).ok_or_else(before)?;
                let dhn = head.backward_input(chunk, &dl)?;
                norm.backward_input(chunk, &dhn, None)?
            }
            (None, None) => return Err(NnError::Stage("the last stage has no head".into())),
        };
        self.seqs.remove(&chunk).ok_or_else(before)?;
        for block in self.blocks.iter_mut().rev() {
            g = block.backward_input(chunk, &g)?;
        }
        match &mut self.embedding {
            Some(emb) => {
                emb.backward_input(chunk, &g)?;
                Ok(None)
            }
            None => Ok(Some(store(&g, self.half)?)),
        }
    }

    fn backward_weight_impl(&mut self, chunk: Chunk) -> Result<(), NnError> {
        plumbing::check_chunk(self.position, chunk, "backward_weight")?;
        if let Some((norm, head)) = &mut self.head {
            head.backward_weight(chunk)?;
            norm.backward_weight(chunk)?;
        }
        for block in self.blocks.iter_mut().rev() {
            block.backward_weight(chunk)?;
        }
        if let Some(emb) = &mut self.embedding {
            emb.backward_weight(chunk)?;
        }
        Ok(())
    }
}

crate::plumbing::impl_param_stage!(GptStage);

crate::plumbing::impl_pipeline_stage!(GptStage, Gpt, "a GPT", {
    fn sharded_params(&self) -> Vec<bool> {
        GptStage::sharded_params(self)
    }

    fn buffers(&self) -> Vec<(String, Vec<f64>)> {
        self.selection_biases()
    }

    fn set_buffer(&mut self, name: &str, values: &[f64]) -> Result<(), NnError> {
        self.set_selection_bias(name, values)
    }

    fn experts(&self) -> Option<&dyn crate::model_stage::ExpertStage> {
        Some(self)
    }

    fn set_loss_scale(&mut self, scale: f64) -> Result<(), NnError> {
        self.loss_scale = scale;
        self.set_aux_loss(self.aux_coef);
        Ok(())
    }

    fn experts_mut(&mut self) -> Option<&mut dyn crate::model_stage::ExpertStage> {
        Some(self)
    }
});

impl crate::model_stage::ExpertStage for GptStage {
    fn moe_layers(&self) -> Vec<(usize, &MoeLayer)> {
        GptStage::moe_layers(self)
    }

    fn moe_layers_mut(&mut self) -> Vec<(usize, &mut MoeLayer)> {
        GptStage::moe_layers_mut(self)
    }

    fn router_counts(&self) -> Vec<(usize, Vec<u64>)> {
        GptStage::router_counts(self)
    }

    fn update_selection_bias(
        &mut self,
        layer: usize,
        loads: &[u64],
        rate: f64,
    ) -> Result<(), NnError> {
        GptStage::update_selection_bias(self, layer, loads, rate)
    }

    fn overlaps_expert_traffic(&self) -> bool {
        GptStage::overlaps_expert_traffic(self)
    }
}

impl From<GptStage> for ModelStage {
    fn from(stage: GptStage) -> Self {
        ModelStage::new(stage)
    }
}

impl ModelStage {
    /// The GPT stage, if this is one.
    pub fn as_gpt(&self) -> Option<&GptStage> {
        self.downcast_ref::<GptStage>()
    }

    /// The GPT stage mutably, if this is one.
    pub fn as_gpt_mut(&mut self) -> Option<&mut GptStage> {
        self.downcast_mut::<GptStage>()
    }
}
