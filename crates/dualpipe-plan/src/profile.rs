//! The cost profile: what each model layer costs, measured or written by hand.
//!
//! JSON (documented in docs/planning.md):
//!
//! ```json
//! { "message_bytes": 33554432,
//!   "layers": [ { "f": 0.004, "i": 0.004, "w": 0.004,
//!                 "activation_bytes": 1.2e9, "parameter_bytes": 2.4e9 } ] }
//! ```
//!
//! Times are seconds on a device of speed 1, per micro-batch; `activation_bytes` is what one
//! micro-batch leaves alive in the layer between its forward and its backward;
//! `parameter_bytes` is everything the layer keeps for the whole step (weights, gradients,
//! optimizer state); `message_bytes` is what crosses a stage boundary per micro-batch (the
//! activations forwards, their gradients backwards).

use dualpipe_sim::Recompute;
use serde::{Deserialize, Serialize};

use crate::error::PlanError;

/// The most layers a profile may list (checked before anything per layer is allocated).
pub const MAX_LAYERS: usize = 4096;
/// The longest `f`, `i` or `w` of one layer, in seconds (about 11 days: anything longer is a
/// unit mistake, and would overflow the simulated times).
pub const MAX_LAYER_SECONDS: f64 = 1e6;
/// The most activation or parameter bytes of one layer (an exabyte).
pub const MAX_LAYER_BYTES: f64 = 1e18;

/// The cost of one layer for one micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerCost {
    /// Forward time, in seconds.
    pub f: f64,
    /// Input-gradient backward time (`I`), in seconds.
    pub i: f64,
    /// Weight-gradient backward time (`W`), in seconds.
    pub w: f64,
    /// Bytes of activations one micro-batch keeps alive in this layer.
    pub activation_bytes: f64,
    /// Bytes this layer keeps for the whole step (weights, gradients, optimizer state).
    pub parameter_bytes: f64,
    /// Bytes one micro-batch keeps in the layer from its input backward (`I`) until its
    /// weight backward (`W`): the inputs and output gradients the weight gradients need,
    /// whatever the recomputation. Absent: `activation_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_bytes: Option<f64>,
    /// What recomputing the layer's activations keeps and costs (`None`: full
    /// recomputation keeps the layer's input, at most the profile's `message_bytes`, and
    /// reruns `f`; selective is not offered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute: Option<RecomputeCost>,
}

/// What recomputing one layer's activations keeps and costs, per micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecomputeCost {
    /// Bytes one micro-batch keeps under full recomputation (the layer's input).
    pub full_bytes: f64,
    /// Bytes it keeps under selective recomputation (the input and the attention's tensors).
    pub selective_bytes: f64,
    /// Seconds of forward that selective recomputation runs again before each backward
    /// (the norms and the MLP); full reruns the whole `f`.
    pub selective_f: f64,
}

impl LayerCost {
    /// Compute time of one micro-batch through the layer: `F + I + W`.
    pub fn work(&self) -> f64 {
        self.f + self.i + self.w
    }

    /// Bytes one micro-batch keeps between `I` and `W` ([`LayerCost::w_bytes`], or
    /// `activation_bytes` when the profile does not give it).
    pub fn backward_bytes(&self) -> f64 {
        self.w_bytes.unwrap_or(self.activation_bytes)
    }

    /// Bytes one micro-batch keeps in the layer between its forward and its backward under
    /// `mode`, and the forward seconds rerun before that backward; `None` when the profile
    /// does not offer `mode` for the layer (selective without [`LayerCost::recompute`]).
    /// `message_bytes` is the profile's (a layer's input, kept by full recomputation when the
    /// layer gives no [`RecomputeCost`]).
    pub fn kept(&self, mode: Recompute, message_bytes: u64) -> Option<(f64, f64)> {
        match (mode, self.recompute) {
            (Recompute::None, _) => Some((self.activation_bytes, 0.0)),
            (Recompute::Full, Some(r)) => Some((r.full_bytes, self.f)),
            (Recompute::Full, None) => {
                Some(((message_bytes as f64).min(self.activation_bytes), self.f))
            }
            (Recompute::Selective, Some(r)) => Some((r.selective_bytes, r.selective_f)),
            (Recompute::Selective, None) => None,
        }
    }
}

/// Per-layer costs of a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Bytes crossing a stage boundary per micro-batch.
    pub message_bytes: u64,
    /// The layers, input to output.
    pub layers: Vec<LayerCost>,
}

impl Profile {
    /// Parses and checks a profile from JSON text. Errors name the field and the fix.
    pub fn from_json(text: &str) -> Result<Profile, PlanError> {
        let profile: Profile = serde_json::from_str(text).map_err(|e| {
            PlanError::Profile(format!(
                "not a valid cost profile ({e}); see docs/planning.md for the format"
            ))
        })?;
        profile.check()?;
        Ok(profile)
    }

    /// Checks every value: at least one and at most [`MAX_LAYERS`] layers, times finite and
    /// `>= 0`, byte counts finite and `>= 0`.
    pub fn check(&self) -> Result<(), PlanError> {
        if self.layers.is_empty() || self.layers.len() > MAX_LAYERS {
            return Err(PlanError::Profile(format!(
                "layers: {} layers listed; give between 1 and {MAX_LAYERS}",
                self.layers.len()
            )));
        }
        for (l, layer) in self.layers.iter().enumerate() {
            let mut optional = layer.recompute.map_or_else(Vec::new, |r| {
                vec![
                    ("recompute.full_bytes", r.full_bytes),
                    ("recompute.selective_bytes", r.selective_bytes),
                    ("recompute.selective_f", r.selective_f),
                ]
            });
            optional.extend(layer.w_bytes.map(|b| ("w_bytes", b)));
            for (name, value) in [
                ("f", layer.f),
                ("i", layer.i),
                ("w", layer.w),
                ("activation_bytes", layer.activation_bytes),
                ("parameter_bytes", layer.parameter_bytes),
            ]
            .into_iter()
            .chain(optional)
            {
                if !value.is_finite() || value < 0.0 {
                    return Err(PlanError::Profile(format!(
                        "layers[{l}].{name} = {value}: give a finite number >= 0"
                    )));
                }
                let (most, unit) = if name.ends_with("bytes") {
                    (MAX_LAYER_BYTES, "bytes, such as 2e8")
                } else {
                    (MAX_LAYER_SECONDS, "seconds, such as 0.004")
                };
                if value > most {
                    return Err(PlanError::Profile(format!(
                        "layers[{l}].{name} = {value:e}: more than {most:e} for one layer; give \
                         it in {unit}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// A profile of `layers` identical layers.
    pub fn uniform(layers: usize, layer: LayerCost, message_bytes: u64) -> Profile {
        Profile {
            message_bytes,
            layers: vec![layer; layers],
        }
    }

    /// Over the layers `range` under `mode`: the bytes one micro-batch keeps between its
    /// forward and its backward and the forward seconds rerun before the backward (see
    /// [`LayerCost::kept`]); `None` when some layer does not offer `mode`.
    pub fn kept(&self, range: std::ops::Range<usize>, mode: Recompute) -> Option<(f64, f64)> {
        self.layers[range].iter().try_fold((0.0, 0.0), |(b, t), l| {
            let (lb, lt) = l.kept(mode, self.message_bytes)?;
            Some((b + lb, t + lt))
        })
    }

    /// Sum of `F`, `I`, `W`, activation, parameter and `I`-to-`W` bytes over `range`.
    pub fn sum(&self, range: std::ops::Range<usize>) -> LayerCost {
        let mut s = LayerCost {
            f: 0.0,
            i: 0.0,
            w: 0.0,
            activation_bytes: 0.0,
            parameter_bytes: 0.0,
            w_bytes: None,
            recompute: None,
        };
        let mut w_bytes = 0.0;
        for l in &self.layers[range] {
            s.f += l.f;
            s.i += l.i;
            s.w += l.w;
            s.activation_bytes += l.activation_bytes;
            s.parameter_bytes += l.parameter_bytes;
            w_bytes += l.backward_bytes();
        }
        s.w_bytes = Some(w_bytes);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_names_bad_fields() {
        let ok = r#"{"message_bytes": 8, "layers": [
            {"f": 1, "i": 1, "w": 1, "activation_bytes": 4, "parameter_bytes": 2}]}"#;
        let p = Profile::from_json(ok).unwrap();
        assert_eq!(p.layers[0].work(), 3.0);
        let bad = ok.replace("\"i\": 1", "\"i\": -1");
        let err = Profile::from_json(&bad).unwrap_err().to_string();
        assert!(err.contains("layers[0].i = -1"), "{err}");
        let err = Profile::from_json(r#"{"message_bytes": 8, "layers": []}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("0 layers"), "{err}");
        let err = Profile::from_json(r#"{"message_bytes": 8}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field `layers`"), "{err}");
    }

    #[test]
    fn out_of_scale_costs_get_the_unit_advice() {
        let ok = r#"{"message_bytes": 8, "layers": [
            {"f": 1, "i": 1, "w": 1, "activation_bytes": 4, "parameter_bytes": 2}]}"#;
        let err = Profile::from_json(&ok.replace("\"f\": 1", "\"f\": 1e308"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("layers[0].f = 1e308: more than 1e6 for one layer")
                && err.contains("seconds"),
            "{err}"
        );
        let err = Profile::from_json(
            &ok.replace("\"activation_bytes\": 4", "\"activation_bytes\": 1e308"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("layers[0].activation_bytes = 1e308") && err.contains("bytes"),
            "{err}"
        );
    }
}
