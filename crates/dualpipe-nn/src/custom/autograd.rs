//! [`AutogradLayer`]: a layer whose backward is candle's autograd.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use candle_core::{Tensor, Var};
use dualpipe_schedule::Chunk;

use super::Layer;
use crate::error::{NnError, TensorContext};
use crate::layers::Param;

/// The function an [`AutogradLayer`] computes: `f(x, params)` from candle operations.
pub type AutogradFn = dyn Fn(&Tensor, &[Tensor]) -> candle_core::Result<Tensor> + Send + Sync;

/// What one chunk's forward kept: its input and parameters as candle variables, and its
/// output (whose graph leads back to them).
struct Saved {
    input: Var,
    params: Vec<Var>,
    output: Tensor,
}

/// A layer given as a function of candle tensors, for users who do not hand-write a split
/// backward: the forward records candle's graph; [`Layer::backward_input`] runs candle's
/// whole backward, adding the weight gradients to the parameters and returning the input's;
/// [`Layer::backward_weight`] has nothing left to do.
///
/// What zero-bubble schedules lose: they place W (the weight gradients) in the bubbles of the
/// pipeline and run I (the input gradient) early to unblock the previous stage. With this
/// layer, I carries the cost of W too and W is empty, so ZB1P, DualPipe and DualPipeV still
/// train it exactly, but with the bubbles of a schedule whose backward is not split (as
/// 1F1B's), and I on the critical path costs the whole backward.
pub struct AutogradLayer {
    names: Vec<String>,
    params: Vec<Param>,
    f: Arc<AutogradFn>,
    saved: HashMap<Chunk, Saved>,
}

impl fmt::Debug for AutogradLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AutogradLayer")
            .field("names", &self.names)
            .field("pending", &self.saved.len())
            .finish_non_exhaustive()
    }
}

impl AutogradLayer {
    /// A layer computing `f(x, params)`, with its parameters' names and initial values.
    pub fn new(
        params: Vec<(String, Tensor)>,
        f: impl Fn(&Tensor, &[Tensor]) -> candle_core::Result<Tensor> + Send + Sync + 'static,
    ) -> Result<Self, NnError> {
        let (names, values): (Vec<String>, Vec<Tensor>) = params.into_iter().unzip();
        Ok(AutogradLayer {
            names,
            params: values
                .into_iter()
                .map(Param::new)
                .collect::<Result<_, _>>()?,
            f: Arc::new(f),
            saved: HashMap::new(),
        })
    }
}

impl Layer for AutogradLayer {
    fn forward(&mut self, chunk: Chunk, x: &Tensor) -> Result<Tensor, NnError> {
        let input = Var::from_tensor(x).ctx("autograd layer input")?;
        let params = self
            .params
            .iter()
            .map(|p| Var::from_tensor(&p.value))
            .collect::<candle_core::Result<Vec<_>>>()
            .ctx("autograd layer parameters")?;
        let values: Vec<Tensor> = params.iter().map(|v| v.as_tensor().clone()).collect();
        let output = (self.f)(input.as_tensor(), &values).ctx("autograd layer forward")?;
        let detached = output.detach();
        if self
            .saved
            .insert(
                chunk,
                Saved {
                    input,
                    params,
                    output,
                },
            )
            .is_some()
        {
            return Err(NnError::Stage(format!("forward of {chunk} ran twice")));
        }
        Ok(detached)
    }

    fn backward_input(&mut self, chunk: Chunk, grad_output: &Tensor) -> Result<Tensor, NnError> {
        let saved = self.saved.remove(&chunk).ok_or_else(|| {
            NnError::Stage(format!("backward_input of {chunk} before its forward"))
        })?;
        // d/dθ Σ (y ⊙ g) = gᵀ ∂y/∂θ: the vector-Jacobian product autograd computes.
        let grads = saved
            .output
            .mul(grad_output)
            .and_then(|t| t.sum_all())
            .and_then(|t| t.backward())
            .ctx("autograd layer backward")?;
        for (p, v) in self.params.iter_mut().zip(&saved.params) {
            if let Some(g) = grads.get(v.as_tensor()) {
                p.accumulate(g)?;
            }
        }
        match grads.get(saved.input.as_tensor()) {
            Some(g) => Ok(g.clone()),
            None => saved
                .input
                .zeros_like()
                .ctx("autograd layer input gradient"),
        }
    }

    fn infer(&self, x: &Tensor) -> Result<Tensor, NnError> {
        let values: Vec<Tensor> = self.params.iter().map(|p| p.value.clone()).collect();
        (self.f)(x, &values).ctx("autograd layer inference")
    }

    fn params(&self) -> Vec<&Param> {
        self.params.iter().collect()
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        self.params.iter_mut().collect()
    }

    fn param_names(&self) -> Vec<String> {
        self.names.clone()
    }

    fn pending(&self) -> usize {
        self.saved.len()
    }
}
