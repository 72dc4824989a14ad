//! The JSON forms of the configuration's foreign types: the schedule kind, the gradient
//! compression and the optimizer.

/// `ScheduleKind` as its name (`"dualpipe"`, `"1f1b"`, ...).
pub(super) mod schedule_name {
    use dualpipe_schedule::ScheduleKind;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(kind: &ScheduleKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(kind.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ScheduleKind, D::Error> {
        let name = String::deserialize(d)?;
        ScheduleKind::from_name(&name).ok_or_else(|| {
            let names: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
            serde::de::Error::custom(format!(
                "unknown schedule '{name}': use one of {}",
                names.join(", ")
            ))
        })
    }
}

/// `Compression` as its flag value (`"none"`, `"bf16"`, `"int8"`, `"1bit"`).
pub(super) mod compression_name {
    use dualpipe_dp::Compression;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(c: &Compression, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(c.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Compression, D::Error> {
        let name = String::deserialize(d)?;
        name.parse::<Compression>()
            .map_err(|e| serde::de::Error::custom(e.to_string()))
    }
}

/// The per-stage recomputation as its text (`"full"`, `"none,selective"`); not written when
/// no stage recomputes, so older outputs keep their members.
pub(super) mod recompute_repr {
    use dualpipe_nn::Recompute;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::config::recompute::{format_recompute, parse_recompute};

    pub fn is_none(r: &Option<Vec<Recompute>>) -> bool {
        r.iter().flatten().all(|&r| r == Recompute::None)
    }

    pub fn serialize<S: Serializer>(r: &Option<Vec<Recompute>>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_recompute(r.as_deref().unwrap_or_default()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<Recompute>>, D::Error> {
        let text = String::deserialize(d)?;
        parse_recompute(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

/// `LrDecay` as its flag value (`"constant"`, `"cosine"`).
pub(super) mod lr_decay_name {
    use dualpipe_nn::LrDecay;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(decay: &LrDecay, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(decay.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LrDecay, D::Error> {
        let name = String::deserialize(d)?;
        LrDecay::from_name(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown learning-rate decay '{name}': use one of {}",
                LrDecay::NAMES.join(", ")
            ))
        })
    }
}

/// `OptimizerKind` as `{"name": "sgd", "momentum": 0.9}` or
/// `{"name": "adamw", "beta1": .., "beta2": .., "eps": .., "weight_decay": ..}`.
pub(super) mod optimizer_repr {
    use dualpipe_nn::OptimizerKind;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(tag = "name", rename_all = "lowercase", deny_unknown_fields)]
    enum Repr {
        Sgd {
            momentum: f64,
        },
        AdamW {
            beta1: f64,
            beta2: f64,
            eps: f64,
            weight_decay: f64,
        },
    }

    pub fn serialize<S: Serializer>(kind: &OptimizerKind, s: S) -> Result<S::Ok, S::Error> {
        match *kind {
            OptimizerKind::Sgd { momentum } => Repr::Sgd { momentum },
            OptimizerKind::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => Repr::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            },
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OptimizerKind, D::Error> {
        Ok(match Repr::deserialize(d)? {
            Repr::Sgd { momentum } => OptimizerKind::Sgd { momentum },
            Repr::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => OptimizerKind::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            },
        })
    }
}
