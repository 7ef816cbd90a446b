//! The goals of the performance round (issue 28), each as a figure of this run beside its goal, so a
//! default run's JSON (`goals`) and Markdown say which are met without a reader doing the arithmetic.
//!
//! A goal whose phase did not run (skipped, or a model that is not installed) is listed with no figure
//! and `met: null`: a run never claims a goal it did not measure.

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
    pub model_ttft_added_ms: Option<f64>,
    pub model_rate_to_direct: Option<f64>,
}

/// Every goal of the round, in the order.
pub fn of(f: &Figures) -> Vec<Goal> {
    let floor = f.grpc_floor_p50_ms.zip(f.raw_publish_ack_p50_ms).map(|(g, r)| g + r);
    vec![
        Goal::at_most(
            "idle followup p50 / (gRPC floor p50 + raw publish-ack p50)",
            "followup_p50_ms / (grpc_floor_p50_ms + raw_publish_ack_p50_ms)",
            ratio_of(f.followup_p50_ms, floor),
            1.25,
        ),
        Goal::at_least("followups/s, 32 clients, 1,000 sessions", "followups_per_s", f.followups_per_s, 3_000.0),
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
            1.3,
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
            150.0,
        ),
        Goal::at_most("idle session memory, bytes", "idle_session_bytes", f.idle_session_bytes, 4_095.0),
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
        String::from("### Goals of this round (issue 28)\n\n| figure | this run | goal | met |\n|---|---:|---:|:-:|\n");
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
            followups_per_s: Some(2_999.0),
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
}
