//! The totals of an evaluation, folded from its rows as they finish.

use turnstile_proto::v1 as pb;

/// Sums over the rows so far.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    total: usize,
    evaluated: u32,
    failed: u32,
    recorded_scored: u32,
    recorded_sum: f64,
    recorded_passed: u32,
    candidate_scored: u32,
    candidate_sum: f64,
    candidate_passed: u32,
    recorded_tokens: u64,
    candidate_tokens: u64,
    recorded_duration_ms: u64,
    candidate_duration_ms: u64,
    skipped_for_budget: u32,
}

fn mean(sum: f64, n: u32) -> f64 {
    if n == 0 { 0.0 } else { sum / f64::from(n) }
}

impl Totals {
    pub(crate) fn new(total: usize) -> Self {
        Self { total, ..Self::default() }
    }

    pub(crate) fn add(&mut self, row: &pb::EvalRow) {
        if let Some(r) = &row.recorded {
            self.recorded_tokens += r.input_tokens + r.output_tokens;
            self.recorded_duration_ms += r.duration_ms;
            if let Some(s) = &r.score {
                self.recorded_scored += 1;
                self.recorded_sum += s.value;
                self.recorded_passed += u32::from(s.passed);
            }
        }
        match &row.candidate {
            Some(c) => {
                self.evaluated += 1;
                self.candidate_tokens += c.input_tokens + c.output_tokens;
                self.candidate_duration_ms += c.duration_ms;
                if let Some(s) = &c.score {
                    self.candidate_scored += 1;
                    self.candidate_sum += s.value;
                    self.candidate_passed += u32::from(s.passed);
                }
            }
            None => {
                self.failed += 1;
                self.skipped_for_budget += u32::from(row.error == super::BUDGET_USED_UP);
            }
        }
    }

    pub(crate) fn summary(&self, run_id: &str, scratch_deleted: u32, scratch_left: Vec<String>) -> pb::EvalSummary {
        pb::EvalSummary {
            run_id: run_id.to_owned(),
            total: self.total as u32,
            evaluated: self.evaluated,
            failed: self.failed,
            recorded_mean: mean(self.recorded_sum, self.recorded_scored),
            candidate_mean: mean(self.candidate_sum, self.candidate_scored),
            recorded_passed: self.recorded_passed,
            candidate_passed: self.candidate_passed,
            recorded_tokens: self.recorded_tokens,
            candidate_tokens: self.candidate_tokens,
            recorded_duration_ms: self.recorded_duration_ms,
            candidate_duration_ms: self.candidate_duration_ms,
            skipped_for_budget: self.skipped_for_budget,
            scratch_deleted,
            scratch_left,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(tokens: u64, score: Option<f64>) -> pb::EvalReply {
        pb::EvalReply {
            input_tokens: tokens,
            duration_ms: 10,
            score: score.map(|v| pb::EvalScore { value: v, passed: v >= 0.5, note: String::new() }),
            ..Default::default()
        }
    }

    #[test]
    fn totals_count_each_side_over_the_rows_it_has() {
        let mut t = Totals::new(3);
        t.add(&pb::EvalRow {
            recorded: Some(reply(5, None)),
            candidate: Some(reply(7, Some(1.0))),
            ..Default::default()
        });
        t.add(&pb::EvalRow {
            recorded: Some(reply(5, None)),
            candidate: Some(reply(7, Some(0.0))),
            ..Default::default()
        });
        let budget = pb::EvalRow {
            recorded: Some(reply(5, None)),
            error: super::super::BUDGET_USED_UP.into(),
            ..Default::default()
        };
        t.add(&budget);
        let s = t.summary("r", 2, vec![]);
        assert_eq!((s.total, s.evaluated, s.failed, s.skipped_for_budget), (3, 2, 1, 1));
        assert_eq!((s.candidate_mean, s.candidate_passed, s.recorded_mean), (0.5, 1, 0.0));
        assert_eq!((s.recorded_tokens, s.candidate_tokens, s.candidate_duration_ms), (15, 14, 20));
        assert_eq!(s.scratch_deleted, 2);
    }
}
