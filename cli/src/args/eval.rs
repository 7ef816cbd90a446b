//! The flags of `turnstile eval` (SPEC §20): which recorded turns, on what, scored how.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

#[derive(Args, Debug)]
pub(crate) struct EvalArgs {
    /// The agent to rerun the turns on.
    #[arg(long)]
    pub(crate) agent: String,
    /// Its version (default: the newest). Not `--version`: clap's holds that name.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) agent_version: u64,
    /// A model of the agent's `overrides.models` to run instead (a session override).
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// Sessions to take turns from (default: those --label selects).
    #[arg(conflicts_with = "label")]
    pub(crate) sessions: Vec<String>,
    /// A label selector (k=v, k!=v, k, !k joined by commas) choosing the sessions; empty: all of the tenant's.
    #[arg(long, value_name = "SELECTOR")]
    pub(crate) label: Option<String>,
    /// The turns of each session to take: N, A..B, A.. or ..B (default: every ended turn).
    #[arg(long, value_name = "RANGE", value_parser = parse_turns)]
    pub(crate) turns: Option<TurnRange>,
    /// How each reply is scored.
    #[arg(long, value_enum, default_value_t = ScorerKind::Exact)]
    pub(crate) scorer: ScorerKind,
    /// contains: a text the reply must hold; repeat for more (none: the recorded reply).
    #[arg(long = "text", value_name = "TEXT")]
    pub(crate) texts: Vec<String>,
    /// contains: compare without case.
    #[arg(long)]
    pub(crate) ignore_case: bool,
    /// json-schema: the JSON Schema file the reply must match.
    #[arg(long, value_name = "FILE")]
    pub(crate) schema: Option<PathBuf>,
    /// judge: the agent that scores each reply from 0 to 10.
    #[arg(long, value_name = "AGENT")]
    pub(crate) judge: Option<String>,
    /// judge: its version (default: the newest).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) judge_version: u64,
    /// judge: what makes a good reply.
    #[arg(long, default_value = "")]
    pub(crate) instructions: String,
    /// hook: the URL each reply is POSTed to; it answers {"score": 0..1}.
    #[arg(long, value_name = "URL")]
    pub(crate) hook: Option<String>,
    /// hook: how long one POST may take (default 10000).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub(crate) hook_timeout_ms: u64,
    /// Turns run at once (default 4, at most 16 and the tenant's request burst).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) parallel: u32,
    /// The most turns taken (default 100, at most 1000); more selected is an error.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) max_turns: u32,
    /// How long one turn may run (default 120000).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub(crate) turn_timeout_ms: u64,
    /// Also write the report as JSON to FILE (with --json it goes to stdout instead of the table).
    #[arg(long, value_name = "FILE")]
    pub(crate) report: Option<PathBuf>,
    /// Exit with status 1 (after printing) when the new replies' mean score is below SCORE (0 to 1) or a
    /// turn could not be rerun: a gate for CI.
    #[arg(long, value_name = "SCORE", value_parser = parse_score)]
    pub(crate) fail_below: Option<f64>,
}

fn parse_score(raw: &str) -> Result<f64, String> {
    match raw.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{raw:?} is not a score from 0 to 1")),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ScorerKind {
    /// The new reply equals the recorded one.
    Exact,
    /// The reply holds each --text (or the recorded reply).
    Contains,
    /// The reply is JSON matching --schema.
    JsonSchema,
    /// --judge scores the reply.
    Judge,
    /// --hook scores the reply.
    Hook,
}

/// `first..=last`, 0 meaning open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TurnRange {
    pub(crate) first: u64,
    pub(crate) last: u64,
}

fn parse_turns(raw: &str) -> Result<TurnRange, String> {
    let number = |s: &str| -> Result<u64, String> {
        if s.is_empty() {
            return Ok(0);
        }
        match s.parse::<u64>() {
            Ok(0) | Err(_) => Err(format!("{s:?} is not a turn number (turns are numbered from 1)")),
            Ok(n) => Ok(n),
        }
    };
    let range = match raw.split_once("..") {
        None if raw.is_empty() => return Err("give N, A..B, A.. or ..B".into()),
        None => TurnRange { first: number(raw)?, last: number(raw)? },
        Some((a, b)) => TurnRange { first: number(a)?, last: number(b)? },
    };
    if range.last > 0 && range.first > range.last {
        return Err(format!("{raw}: the first turn is after the last"));
    }
    Ok(range)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn turn_ranges_read_one_turn_both_ends_or_one_end() {
        assert_eq!(parse_turns("3").unwrap(), TurnRange { first: 3, last: 3 });
        assert_eq!(parse_turns("2..5").unwrap(), TurnRange { first: 2, last: 5 });
        assert_eq!(parse_turns("2..").unwrap(), TurnRange { first: 2, last: 0 });
        assert_eq!(parse_turns("..4").unwrap(), TurnRange { first: 0, last: 4 });
        assert!(parse_turns("5..2").unwrap_err().contains("after the last"));
        assert!(parse_turns("0").is_err());
        assert!(parse_turns("x..").is_err());
    }
}
