//! The values client commands take that clap cannot parse by itself.

use std::str::FromStr;

use turnstile_model::message::{MessageSource, Target};
use turnstile_model::{CancelCause, InjectMode};

/// `--source user|plugin[:NAME[:FORM]]|goal:ID:REV:ROUND|tool:CALL_ID|model:PROVIDER:MODEL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceArg(pub MessageSource);

impl FromStr for SourceArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |v: &str, what: &str| v.parse::<u64>().map_err(|_| format!("{what} {v:?} is not a number"));
        let source = match parts.as_slice() {
            ["user"] => MessageSource::User,
            ["plugin"] => MessageSource::Plugin { plugin: String::new(), form: None },
            ["plugin", name] => MessageSource::Plugin { plugin: (*name).to_owned(), form: None },
            ["plugin", name, form] => {
                MessageSource::Plugin { plugin: (*name).to_owned(), form: Some((*form).to_owned()) }
            }
            ["goal", id, rev, round] => MessageSource::Goal {
                goal_id: (*id).to_owned(),
                revision: num(rev, "goal revision")?,
                round: num(round, "goal round")?,
            },
            ["tool", call_id] => MessageSource::Tool { call_id: (*call_id).to_owned() },
            ["model", provider, model] => {
                MessageSource::Model { provider: (*provider).to_owned(), model: (*model).to_owned() }
            }
            _ => {
                return Err(format!(
                    "source {s:?} is not valid; use user, plugin:NAME[:FORM], goal:ID:REV:ROUND, tool:CALL_ID or model:PROVIDER:MODEL"
                ));
            }
        };
        Ok(Self(source))
    }
}

/// `--cause user|parent|hook:REASON|disposed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CauseArg(pub CancelCause);

impl FromStr for CauseArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(match s.split_once(':') {
            None if s == "user" => CancelCause::User,
            None if s == "parent" => CancelCause::Parent,
            None if s == "disposed" => CancelCause::Disposed,
            Some(("hook", reason)) => CancelCause::Hook { reason: reason.to_owned() },
            _ => return Err(format!("cause {s:?} is not valid; use user, parent, hook:REASON or disposed")),
        }))
    }
}

/// `--inject-mode pending|out-of-turn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InjectModeArg(pub InjectMode);

impl FromStr for InjectModeArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        one_of("inject mode", s, &[("pending", InjectMode::Pending), ("out-of-turn", InjectMode::OutOfTurn)]).map(Self)
    }
}

/// `--target next-turn|next-step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetArg(pub Target);

impl FromStr for TargetArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        one_of("target", s, &[("next-turn", Target::NextTurn), ("next-step", Target::NextStep)]).map(Self)
    }
}

/// The value `s` names among `choices`, or an error naming `what` and every choice.
fn one_of<T: Copy>(what: &str, s: &str, choices: &[(&str, T)]) -> Result<T, String> {
    choices.iter().find(|(name, _)| *name == s).map(|(_, value)| *value).ok_or_else(|| {
        let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
        let (last, rest) = names.split_last().map_or(("", &[][..]), |(last, rest)| (*last, rest));
        let listed = if rest.is_empty() { last.to_owned() } else { format!("{} or {last}", rest.join(", ")) };
        format!("{what} {s:?} is not valid; use {listed}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_from_their_short_form() {
        assert_eq!("user".parse::<SourceArg>().unwrap().0, MessageSource::User);
        assert_eq!(
            "plugin:mem:recall".parse::<SourceArg>().unwrap().0,
            MessageSource::Plugin { plugin: "mem".into(), form: Some("recall".into()) }
        );
        assert_eq!(
            "plugin".parse::<SourceArg>().unwrap().0,
            MessageSource::Plugin { plugin: String::new(), form: None }
        );
        assert_eq!(
            "goal:g1:2:3".parse::<SourceArg>().unwrap().0,
            MessageSource::Goal { goal_id: "g1".into(), revision: 2, round: 3 }
        );
        assert_eq!("tool:c1".parse::<SourceArg>().unwrap().0, MessageSource::Tool { call_id: "c1".into() });
        assert_eq!(
            "model:openai:gpt".parse::<SourceArg>().unwrap().0,
            MessageSource::Model { provider: "openai".into(), model: "gpt".into() }
        );
        assert!("goal:g1:x:1".parse::<SourceArg>().unwrap_err().contains("not a number"));
        assert!("robot".parse::<SourceArg>().unwrap_err().contains("plugin:NAME[:FORM]"));
    }

    #[test]
    fn causes_and_targets_parse() {
        assert_eq!("hook:budget".parse::<CauseArg>().unwrap().0, CancelCause::Hook { reason: "budget".into() });
        assert_eq!("parent".parse::<CauseArg>().unwrap().0, CancelCause::Parent);
        assert!("boss".parse::<CauseArg>().is_err());
        assert_eq!("next-step".parse::<TargetArg>().unwrap().0, Target::NextStep);
        assert_eq!(
            "next".parse::<TargetArg>().unwrap_err(),
            r#"target "next" is not valid; use next-turn or next-step"#
        );
        assert_eq!("out-of-turn".parse::<InjectModeArg>().unwrap().0, InjectMode::OutOfTurn);
        assert_eq!(
            "later".parse::<InjectModeArg>().unwrap_err(),
            r#"inject mode "later" is not valid; use pending or out-of-turn"#
        );
    }
}
