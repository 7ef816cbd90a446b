//! The goals of the performance round (issue 44, after issue 28's), each as a figure of this run beside its
//! goal, so a default run's JSON (`goals`) and Markdown say which are met without a reader doing the
//! arithmetic.
//!
//! A goal whose phase did not run (skipped, or a model that is not installed) is listed with no figure
//! and `met: null`: a run never claims a goal it did not measure. The "one million" goals are measured only
//! by an idle phase of at least 1,000,000 sessions (`--idle-sessions 1000000`).

use serde::Serialize;

use crate::stats::ratio_of;

/// One goal: the figure this run measured, what it must be, and whether it is.
#[derive(Debug, Serialize)]
pub struct Goal {
    /// What is measured, in words.
    pub name: &'static str,
    /// How the figure is made from the run's JSON keys.
    pub from: &'static str,
    pub value: Option<f64>,
    /// `≤` or `≥` (a `<` goal is written as `≤` just under it).
    pub op: &'static str,
    pub goal: f64,
    pub met: Option<bool>,
}

impl Goal {
    fn at_most(name: &'static str, from: &'static str, value: Option<f64>, goal: f64) -> Self {
        Self { name, from, value, op: "≤", goal, met: value.map(|v| v <= goal) }
    }

    fn at_least(name: &'static str, from: &'static str, value: Option<f64>, goal: f64) -> Self {
        Self { name, from, value, op: "≥", goal, met: value.map(|v| v >= goal) }
    }
}

/// The figures a goal is made of, as the run's summary has them.
#[derive(Debug, Default)]
pub struct Figures {
    pub followup_p50_ms: Option<f64>,
    pub grpc_floor_p50_ms: Option<f64>,
    pub raw_publish_ack_p50_ms: Option<f64>,
    pub followups_per_s: Option<f64>,
    pub cluster_to_single_node_followups: Option<f64>,
    pub cluster_cpu_s_per_1k: Option<f64>,
    pub single_node_cpu_s_per_1k: Option<f64>,
    pub watch_from_0_100k_ms: Option<f64>,
    pub fanout_delta_p99_ms: Option<f64>,
    pub steer_to_message_p99_ms: Option<f64>,
    pub failover_kill9_p99_ms: Option<f64>,
    pub idle_session_bytes: Option<f64>,
    pub idle_sessions: Option<usize>,
    pub passivated_followup_p99_ms: Option<f64>,
    pub model_ttft_added_ms: Option<f64>,
    pub model_rate_to_direct: Option<f64>,
}

/// Idle sessions of the "one million" goals.
pub const ONE_MILLION: usize = 1_000_000;

/// Every goal of the round, in the order.
pub fn of(f: &Figures) -> Vec<Goal> {
    let floor = f.grpc_floor_p50_ms.zip(f.raw_publish_ack_p50_ms).map(|(g, r)| g + r);
    let at_a_million = |v: Option<f64>| v.filter(|_| f.idle_sessions.is_some_and(|n| n >= ONE_MILLION));
    vec![
        Goal::at_most(
            "idle followup p50 / (gRPC floor p50 + raw publish-ack p50)",
            "followup_p50_ms / (grpc_floor_p50_ms + raw_publish_ack_p50_ms)",
            ratio_of(f.followup_p50_ms, floor),
            1.25,
        ),
        Goal::at_least("followups/s, 32 clients, 1,000 sessions", "followups_per_s", f.followups_per_s, 4_000.0),
        Goal::at_least(
            "cluster followups/s / single node",
            "cluster_to_single_node_followups",
            f.cluster_to_single_node_followups,
            0.8,
        ),
        Goal::at_most(
            "cluster CPU-s per 1,000 followups / single node",
            "cluster_cpu_s_per_1k_followups.total / cpu_s_per_1k_followups.total",
            ratio_of(f.cluster_cpu_s_per_1k, f.single_node_cpu_s_per_1k),
            1.8,
        ),
        Goal::at_most(
            "Watch from seq 0 of a 100k-event session → caught-up, ms",
            "reads.watch_caught_up_100k_from_0_ms",
            f.watch_from_0_100k_ms,
            300.0,
        ),
        Goal::at_most(
            "1,000 watchers, followup → first delta p99, ms",
            "watch_fanout_delta_p99_ms",
            f.fanout_delta_p99_ms,
            40.0,
        ),
        Goal::at_most("steer → its user/message p99, ms", "steer_to_message_p99_ms", f.steer_to_message_p99_ms, 1.5),
        Goal::at_most(
            "kill -9 → next accepted followup p99, ms",
            "failover.failover_kill9_p99_ms",
            f.failover_kill9_p99_ms,
            120.0,
        ),
        Goal::at_most("idle session memory, bytes", "idle_session_bytes", f.idle_session_bytes, 4_095.0),
        Goal::at_most(
            "idle session memory at 1,000,000 sessions, bytes",
            "idle_session_bytes (idle_sessions ≥ 1,000,000)",
            at_a_million(f.idle_session_bytes),
            4_095.0,
        ),
        Goal::at_most(
            "followup to a random passivated session p99 at 1,000,000 sessions, ms",
            "idle_passivated_followup_p99_ms (idle_sessions ≥ 1,000,000)",
            at_a_million(f.passivated_followup_p99_ms),
            20.0,
        ),
        Goal::at_most("model TTFT through Turnstile − direct, ms", "model_ttft_added_ms", f.model_ttft_added_ms, 2.0),
        Goal::at_least(
            "model deltas/s through Turnstile / direct",
            "model_rate_to_direct",
            f.model_rate_to_direct,
            0.95,
        ),
    ]
}

/// The goals as a Markdown table.
pub fn markdown(goals: &[Goal]) -> String {
    use std::fmt::Write as _;
    let mut out =
        String::from("### Goals of this round (issue 44)\n\n| figure | this run | goal | met |\n|---|---:|---:|:-:|\n");
    for g in goals {
        let value = g.value.map_or_else(|| "not measured".to_owned(), format_figure);
        let met = match g.met {
            Some(true) => "✓",
            Some(false) => "✗",
            None => "—",
        };
        let _ = writeln!(out, "| {} | {value} | {} {} | {met} |", g.name, g.op, format_figure(g.goal));
    }
    out.push('\n');
    out
}

fn format_figure(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goal_is_met_only_when_its_figure_was_measured_and_is_on_the_right_side() {
        let f = Figures {
            followup_p50_ms: Some(0.39),
            grpc_floor_p50_ms: Some(0.17),
            raw_publish_ack_p50_ms: Some(0.15),
            followups_per_s: Some(3_999.0),
            watch_from_0_100k_ms: Some(300.0),
            ..Figures::default()
        };
        let goals = of(&f);
        let by_key = |from: &str| goals.iter().find(|g| g.from.starts_with(from)).unwrap();
        // 0.39 / 0.32 = 1.22.
        assert_eq!(by_key("followup_p50_ms").met, Some(true));
        assert_eq!(by_key("followups_per_s").met, Some(false));
        assert_eq!(by_key("reads.").met, Some(true));
        assert_eq!(by_key("model_rate_to_direct").met, None, "a phase that did not run claims nothing");
        assert!(markdown(&goals).contains("| not measured |"));
    }

    #[test]
    fn the_one_million_goals_are_measured_only_at_a_million_sessions() {
        let at = |sessions: usize| {
            let f = Figures {
                idle_session_bytes: Some(3_700.0),
                idle_sessions: Some(sessions),
                passivated_followup_p99_ms: Some(21.0),
                ..Figures::default()
            };
            of(&f)
        };
        let met = |goals: &[Goal], from: &str| goals.iter().find(|g| g.from.starts_with(from)).unwrap().met;
        let small = at(100_000);
        assert_eq!(met(&small, "idle_session_bytes (idle_sessions"), None);
        assert_eq!(met(&small, "idle_passivated_followup_p99_ms"), None);
        assert_eq!(met(&small, "idle_session_bytes"), Some(true), "the default run's own memory goal stands");
        let million = at(ONE_MILLION);
        assert_eq!(met(&million, "idle_session_bytes (idle_sessions"), Some(true));
        assert_eq!(met(&million, "idle_passivated_followup_p99_ms"), Some(false), "21 ms is over 20 ms");
    }
}
