//! Activation recomputation per model stage ([`ModelSection::recompute`]): parsing the
//! `none,full,selective` lists, the checks, and what each stage uses.
//!
//! [`ModelSection::recompute`]: crate::config::ModelSection::recompute

use dualpipe_nn::Recompute;

use crate::config::{Field, ModelKind, Naming, TrainConfig};
use crate::error::TrainError;

/// `none`, `full` or `selective`, or a comma list of them, one per model stage.
pub fn parse_recompute(text: &str) -> Result<Vec<Recompute>, String> {
    text.split(',')
        .map(|s| {
            let s = s.trim();
            Recompute::from_name(s).ok_or_else(|| {
                format!("`{s}` is not a recomputation; give none, full or selective (or a comma list of them, one per model stage)")
            })
        })
        .collect()
}

/// The list as [`parse_recompute`] reads it (`none` for the empty list).
pub fn format_recompute(r: &[Recompute]) -> String {
    if r.is_empty() {
        return Recompute::None.name().into();
    }
    r.iter().map(|r| r.name()).collect::<Vec<_>>().join(",")
}

impl TrainConfig {
    /// What model stage `stage`'s forwards keep: the list's entry for it, its one value for
    /// every stage, or [`Recompute::None`] when the list is empty.
    pub fn stage_recompute(&self, stage: usize) -> Recompute {
        match self.model.recompute.as_deref().unwrap_or_default() {
            [] => Recompute::None,
            [one] => *one,
            many => many.get(stage).copied().unwrap_or_default(),
        }
    }

    /// Whether some stage recomputes.
    pub fn recomputes(&self) -> bool {
        self.model
            .recompute
            .iter()
            .flatten()
            .any(|&r| r != Recompute::None)
    }

    /// The recomputation's checks: the GPT only, one value or one per model stage.
    pub(crate) fn check_recompute(&self, naming: Naming) -> Result<(), TrainError> {
        let r = self.model.recompute.as_deref().unwrap_or_default();
        let field = Field::Recompute.name(naming);
        let shown = format_recompute(r);
        if self.recomputes() && self.model.kind != ModelKind::Gpt {
            return Err(TrainError::Config(format!(
                "{field} {shown}: recomputation is built for the GPT's blocks; drop it for the {} model",
                self.model.kind
            )));
        }
        let stages = self.model_stages();
        if r.len() > 1 && r.len() != stages {
            return Err(TrainError::Config(format!(
                "{field} {shown} lists {} stages but the {} schedule on {} {} has {stages} \
                 model stages; give one value for all or one per stage",
                r.len(),
                self.schedule.kind,
                Field::Ranks.name(naming),
                self.schedule.ranks
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_apply_per_stage() {
        assert_eq!(parse_recompute("full").unwrap(), vec![Recompute::Full]);
        let r = parse_recompute("none, selective,full,none").unwrap();
        assert_eq!(format_recompute(&r), "none,selective,full,none");
        assert!(parse_recompute("most").unwrap_err().contains("`most`"));
        let mut c = TrainConfig::DEFAULT;
        assert_eq!(c.stage_recompute(3), Recompute::None);
        assert!(!c.recomputes());
        c.model.recompute = Some(vec![Recompute::Full]);
        assert_eq!(c.stage_recompute(3), Recompute::Full);
        c.model.recompute = Some(r);
        assert_eq!(c.stage_recompute(1), Recompute::Selective);
        assert!(c.check_recompute(Naming::Fields).is_ok());
        c.model.recompute = Some(vec![Recompute::Full, Recompute::None]);
        let e = c.check_recompute(Naming::Fields).unwrap_err().to_string();
        assert!(e.contains("recompute full,none lists 2 stages"), "{e}");
    }
}
