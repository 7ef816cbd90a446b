//! The totals of an evaluation, folded from its rows as they finish.

use turnstile_proto::v1 as pb;

/// Sums over the rows so far.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    total: usize,
    evaluated: u32,
    failed: u32,
    recorded: Side,
    candidate: Side,
    skipped_for_budget: u32,
}

/// The sums of one side's replies (the recorded ones, or the candidate's).
#[derive(Debug, Default)]
struct Side {
    scored: u32,
    sum: f64,
    passed: u32,
    tokens: u64,
    duration_ms: u64,
}

impl Side {
    fn add(&mut self, reply: &pb::EvalReply) {
        self.tokens += reply.input_tokens + reply.output_tokens;
        self.duration_ms += reply.duration_ms;
        if let Some(s) = &reply.score {
            self.scored += 1;
            self.sum += s.value;
            self.passed += u32::from(s.passed);
        }
    }

    /// The mean score of the scored replies (0 with none).
    fn mean(&self) -> f64 {
        if self.scored == 0 { 0.0 } else { self.sum / f64::from(self.scored) }
    }
}

impl Totals {
    pub(crate) fn new(total: usize) -> Self {
        Self { total, ..Self::default() }
    }

    pub(crate) fn add(&mut self, row: &pb::EvalRow) {
        if let Some(r) = &row.recorded {
            self.recorded.add(r);
        }
        match &row.candidate {
            Some(c) => {
                self.evaluated += 1;
                self.candidate.add(c);
            }
            None => {
                self.failed += 1;
                self.skipped_for_budget += u32::from(row.error == super::BUDGET_USED_UP);
            }
        }
    }

    pub(crate) fn summary(&self, run_id: &str, scratch_deleted: u32, scratch_left: Vec<String>) -> pb::EvalSummary {
        let (recorded, candidate) = (&self.recorded, &self.candidate);
        pb::EvalSummary {
            run_id: run_id.to_owned(),
            total: self.total as u32,
            evaluated: self.evaluated,
            failed: self.failed,
            recorded_mean: recorded.mean(),
            candidate_mean: candidate.mean(),
            recorded_passed: recorded.passed,
            candidate_passed: candidate.passed,
            recorded_tokens: recorded.tokens,
            candidate_tokens: candidate.tokens,
            recorded_duration_ms: recorded.duration_ms,
            candidate_duration_ms: candidate.duration_ms,
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
