//! `turnstile eval` (SPEC §20): recorded turns rerun on another agent version and scored, old beside new,
//! as a table (or, with `--json`, the JSON report) on stdout, progress on stderr, and with `--report FILE`
//! the JSON report in FILE as well.
//!
//! The report is `{"started": EvalStarted, "rows": [EvalRow…] (in selection order), "summary":
//! EvalSummary}`, each message in the protobuf JSON mapping.

use std::io::{IsTerminal, Write};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use turnstile_proto::v1 as pb;

use crate::args::{EvalArgs, ScorerKind};
use crate::client::Client;

fn scorer(a: &EvalArgs) -> Result<pb::EvalScorer> {
    use pb::eval_scorer::Kind;
    let kind = match a.scorer {
        ScorerKind::Exact => Kind::Exact(pb::ExactScorer {}),
        ScorerKind::Contains => {
            Kind::Contains(pb::ContainsScorer { texts: a.texts.clone(), ignore_case: a.ignore_case })
        }
        ScorerKind::JsonSchema => {
            let Some(path) = &a.schema else { bail!("--scorer json-schema needs --schema FILE") };
            let schema_json =
                std::fs::read_to_string(path).with_context(|| format!("reading --schema {}", path.display()))?;
            Kind::JsonSchema(pb::JsonSchemaScorer { schema_json })
        }
        ScorerKind::Judge => {
            let Some(agent) = &a.judge else { bail!("--scorer judge needs --judge AGENT") };
            Kind::Judge(pb::JudgeScorer {
                agent: agent.clone(),
                version: a.judge_version,
                instructions: a.instructions.clone(),
            })
        }
        ScorerKind::Hook => {
            let Some(url) = &a.hook else { bail!("--scorer hook needs --hook URL") };
            Kind::Hook(pb::HookScorer { url: url.clone(), timeout_ms: a.hook_timeout_ms })
        }
    };
    Ok(pb::EvalScorer { kind: Some(kind) })
}

fn request(client: &Client, a: &EvalArgs) -> Result<pb::EvaluateRequest> {
    let range = a.turns.unwrap_or(crate::args::TurnRange { first: 0, last: 0 });
    Ok(pb::EvaluateRequest {
        tenant: client.tenant.clone(),
        sessions: a.sessions.iter().map(|s| client.session(s)).collect(),
        label_selector: a.label.clone().unwrap_or_default(),
        first_turn: range.first,
        last_turn: range.last,
        agent: a.agent.clone(),
        version: a.agent_version,
        model: a.model.clone().unwrap_or_default(),
        scorer: Some(scorer(a)?),
        parallel: a.parallel,
        max_turns: a.max_turns,
        turn_timeout_ms: a.turn_timeout_ms,
    })
}

/// The progress line on stderr: rewritten in place on a terminal, else printed once at the end.
struct Progress {
    terminal: bool,
    total: u32,
    done: u32,
    failed: u32,
}

impl Progress {
    fn line(&self) -> String {
        let width = 30usize;
        let filled = if self.total == 0 { width } else { (self.done as usize * width) / self.total as usize };
        format!(
            "eval [{}{}] {}/{} turns, {} failed",
            "#".repeat(filled),
            "-".repeat(width - filled),
            self.done,
            self.total,
            self.failed
        )
    }

    fn show(&self) {
        if self.terminal {
            let mut err = std::io::stderr();
            let _ = write!(err, "\r{}", self.line());
            let _ = err.flush();
        }
    }

    fn finish(&self) {
        if self.terminal {
            eprintln!("\r{}", self.line());
        } else {
            eprintln!("{}", self.line());
        }
    }
}

pub async fn eval(client: &mut Client, a: EvalArgs) -> Result<()> {
    let request = request(client, &a)?;
    let mut stream = client.api.evaluate(request).await?.into_inner();
    let mut progress = Progress { terminal: std::io::stderr().is_terminal(), total: 0, done: 0, failed: 0 };
    let mut started = None;
    let mut rows = Vec::new();
    let mut summary = None;
    while let Some(item) = stream.message().await? {
        match item.item {
            Some(pb::evaluate_item::Item::Started(s)) => {
                progress.total = s.total;
                progress.show();
                started = Some(s);
            }
            Some(pb::evaluate_item::Item::Row(row)) => {
                progress.done += 1;
                progress.failed += u32::from(row.candidate.is_none());
                progress.show();
                rows.push(row);
            }
            Some(pb::evaluate_item::Item::Summary(s)) => summary = Some(s),
            None => {}
        }
    }
    progress.finish();
    let (Some(started), Some(summary)) = (started, summary) else {
        bail!(
            "the evaluation's stream ended before its summary; the gateway may have stopped (its scratch sessions carry the label turnstile/eval)"
        )
    };
    rows.sort_by_key(|r| r.index);
    let report = report(&started, &rows, &summary)?;
    if let Some(path) = &a.report {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing --report {}", path.display()))?;
    }
    if client.json {
        println!("{report}");
    } else {
        print!("{}", table(&rows, &summary));
    }
    gate(a.fail_below, &summary)
}

/// `--fail-below`: an error (exit status 1) when the new replies score under the bar or a turn failed.
fn gate(bar: Option<f64>, summary: &pb::EvalSummary) -> Result<()> {
    let Some(bar) = bar else { return Ok(()) };
    if summary.failed > 0 {
        bail!("{} of {} turns could not be rerun (--fail-below)", summary.failed, summary.total);
    }
    if summary.candidate_mean < bar {
        bail!("the new replies' mean score {:.2} is below --fail-below {bar}", summary.candidate_mean);
    }
    Ok(())
}

fn report(started: &pb::EvalStarted, rows: &[pb::EvalRow], summary: &pb::EvalSummary) -> Result<Value> {
    let rows = rows.iter().map(crate::json::value).collect::<Result<Vec<_>>>()?;
    Ok(json!({
        "started": crate::json::value(started)?,
        "rows": rows,
        "summary": crate::json::value(summary)?,
    }))
}

/// At most `n` characters of `text` on one line.
fn cell(text: &str, n: usize) -> String {
    let flat = text.replace(['\n', '\r', '\t'], " ");
    if flat.chars().count() > n {
        let cut: String = flat.chars().take(n.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        flat
    }
}

fn score_cell(reply: Option<&pb::EvalReply>) -> String {
    match reply.and_then(|r| r.score.as_ref()) {
        Some(s) => format!("{:.2}{}", s.value, if s.passed { "" } else { "✗" }),
        None => "-".to_owned(),
    }
}

/// The old-beside-new table and its totals line.
pub(crate) fn table(rows: &[pb::EvalRow], summary: &pb::EvalSummary) -> String {
    let header = [
        "SESSION",
        "TURN",
        "OLD",
        "NEW",
        "OLD TOK",
        "NEW TOK",
        "OLD MS",
        "NEW MS",
        "OLD TOOLS",
        "NEW TOOLS",
        "OLD REPLY",
        "NEW REPLY",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for row in rows {
        let old = row.recorded.as_ref();
        let new = row.candidate.as_ref();
        let tokens =
            |r: Option<&pb::EvalReply>| r.map_or("-".into(), |r| (r.input_tokens + r.output_tokens).to_string());
        let ms = |r: Option<&pb::EvalReply>| r.map_or("-".into(), |r| r.duration_ms.to_string());
        let tools = |r: Option<&pb::EvalReply>| r.map_or("-".into(), |r| cell(&r.tools.join(","), 16));
        let new_reply = match new {
            Some(r) => cell(&r.text, 32),
            None => format!("error: {}", cell(&row.error, 32)),
        };
        lines.push(vec![
            row.session.as_ref().map(|s| s.id.clone()).unwrap_or_default(),
            row.turn.to_string(),
            score_cell(old),
            score_cell(new),
            tokens(old),
            tokens(new),
            ms(old),
            ms(new),
            tools(old),
            tools(new),
            old.map_or(String::new(), |r| cell(&r.text, 32)),
            new_reply,
        ]);
    }
    let widths: Vec<usize> =
        (0..header.len()).map(|i| lines.iter().map(|l| l[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> =
            line.iter().zip(&widths).map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count()))).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&format!(
        "{} turns: {} evaluated, {} failed; mean score old {:.2} new {:.2}; passed old {} new {}; tokens old {} new {}; \
         scratch sessions deleted {}{}\n",
        summary.total,
        summary.evaluated,
        summary.failed,
        summary.recorded_mean,
        summary.candidate_mean,
        summary.recorded_passed,
        summary.candidate_passed,
        summary.recorded_tokens,
        summary.candidate_tokens,
        summary.scratch_deleted,
        if summary.scratch_left.is_empty() {
            String::new()
        } else {
            format!(", left {}", summary.scratch_left.join(" "))
        }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_puts_old_beside_new_and_totals_last() {
        let reply = |text: &str, score: Option<f64>| pb::EvalReply {
            text: text.into(),
            input_tokens: 3,
            output_tokens: 2,
            duration_ms: 7,
            score: score.map(|v| pb::EvalScore { value: v, passed: v >= 0.5, note: String::new() }),
            ..Default::default()
        };
        let rows = [
            pb::EvalRow {
                session: Some(pb::SessionRef { tenant: "t".into(), id: "s1".into() }),
                turn: 2,
                recorded: Some(reply("echo: hi", None)),
                candidate: Some(reply("system: be brief\nand kind", Some(0.0))),
                ..Default::default()
            },
            pb::EvalRow {
                session: Some(pb::SessionRef { tenant: "t".into(), id: "s1".into() }),
                turn: 3,
                recorded: Some(reply("echo: yo", None)),
                error: "the turn did not end".into(),
                ..Default::default()
            },
        ];
        let summary = pb::EvalSummary { total: 2, evaluated: 1, failed: 1, scratch_deleted: 2, ..Default::default() };
        let text = table(&rows, &summary);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("SESSION  TURN  OLD  NEW    OLD TOK"), "{text}");
        assert!(lines[1].contains("0.00✗") && lines[1].contains("system: be brief and kind"), "{text}");
        assert!(lines[2].contains("error: the turn did not end"), "{text}");
        assert!(lines[3].starts_with("2 turns: 1 evaluated, 1 failed"), "{text}");
    }
}
