//! Errors of schedule generation, validation and parsing.

use std::fmt;

use crate::validate::ValidationError;

/// Anything that can go wrong while making, checking or reading a schedule.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// The requested configuration is not supported by the schedule kind. The message names
    /// the constraint and the nearest valid values, by field; see [`ConfigError::render`] for
    /// other names (a command line's flags).
    #[error("{0}")]
    InvalidConfig(ConfigError),
    /// The schedule breaks a rule (see [`ValidationError`]).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// A JSON or CSV text could not be read.
    #[error("{0}")]
    Parse(String),
}

/// A setting a schedule is built from, as a caller names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    /// The schedule kind.
    Kind,
    /// Pipeline ranks.
    Ranks,
    /// Micro-batches per step.
    MicroBatches,
    /// Stages per rank (interleaved).
    VirtualStages,
}

impl Knob {
    /// The field's name, as the library's callers (and JSON) spell it.
    pub fn field(self) -> &'static str {
        match self {
            Knob::Kind => "kind",
            Knob::Ranks => "ranks",
            Knob::MicroBatches => "micro_batches",
            Knob::VirtualStages => "virtual_stages",
        }
    }
}

/// One piece of a [`ConfigError`]'s message.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Plain words.
    Text(String),
    /// A setting's name ("fewer ranks").
    Name(Knob),
    /// A setting with a value ("use ranks = 2").
    Setting(Knob, String),
}

/// An unsupported configuration, kept as words and the settings it names, so each caller
/// names the settings its own way: by field (its `Display`), by flag, by keyword argument.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    parts: Vec<Part>,
}

impl ConfigError {
    /// A message starting with `text`.
    pub fn new(text: impl Into<String>) -> Self {
        ConfigError {
            parts: vec![Part::Text(text.into())],
        }
    }

    /// Appends words.
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.parts.push(Part::Text(text.into()));
        self
    }

    /// Appends a setting's name.
    pub fn name(mut self, knob: Knob) -> Self {
        self.parts.push(Part::Name(knob));
        self
    }

    /// Appends a setting with its value.
    pub fn setting(mut self, knob: Knob, value: impl fmt::Display) -> Self {
        self.parts.push(Part::Setting(knob, value.to_string()));
        self
    }

    /// The pieces, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The message with each setting named by `name(knob, value)` (`value` is `None` where only
    /// the name appears): a command line passes its flags (`--ranks 2`).
    pub fn render(&self, name: impl Fn(Knob, Option<&str>) -> String) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Name(knob) => out.push_str(&name(*knob, None)),
                Part::Setting(knob, value) => out.push_str(&name(*knob, Some(value))),
            }
        }
        out
    }
}

impl fmt::Display for ConfigError {
    /// Settings by field: `ranks = 2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(|knob, value| match value {
            Some(v) => format!("{} = {v}", knob.field()),
            None => knob.field().to_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_named_by_field_or_by_the_callers_names() {
        let e = ConfigError::new("use ")
            .setting(Knob::Ranks, 2)
            .text(" or fewer ")
            .name(Knob::MicroBatches);
        assert_eq!(e.to_string(), "use ranks = 2 or fewer micro_batches");
        let flags = e.render(|knob, value| match (knob, value) {
            (Knob::Ranks, Some(v)) => format!("--ranks {v}"),
            (Knob::MicroBatches, None) => "--micro-batches".into(),
            other => panic!("unexpected {other:?}"),
        });
        assert_eq!(flags, "use --ranks 2 or fewer --micro-batches");
    }
}
