//! One evaluation run: each selected turn rerun in a scratch session and scored beside its recording,
//! `parallel` at a time, each admitted by the tenant's request rate and stopped once its daily token budget
//! is used up; rows streamed as they finish, the summary last, the scratch sessions deleted before the
//! stream ends whatever happened.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use turnstile_model::message::SessionRef;
use turnstile_model::{Fork, Tenant};
use turnstile_proto::codec::encode_session_ref;
use turnstile_proto::v1 as pb;

use super::hook::{HookClient, HookRequest};
use super::scorer::{self, Scorer};
use super::scratch::{Failed, Profile, Scratch};
use super::summary::Totals;
use super::turns::TurnRecord;
use crate::quota::RETRY_AFTER_MS;
use crate::service::Gateway;

/// A selected turn.
#[derive(Clone, Debug)]
pub(crate) struct Selected {
    pub(crate) session: SessionRef,
    pub(crate) record: TurnRecord,
}

/// Everything a run needs, checked.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) tenant: Tenant,
    pub(crate) run_id: String,
    pub(crate) candidate: Profile,
    /// The judge's agent, when the scorer is a judge.
    pub(crate) judge: Option<Profile>,
    pub(crate) scorer: Scorer,
    pub(crate) hook: Option<HookClient>,
    pub(crate) parallel: usize,
    pub(crate) turn_timeout: Duration,
    pub(crate) selected: Vec<Selected>,
}

struct Run {
    gateway: Gateway,
    plan: Plan,
    scratch: Scratch,
    cancel: CancellationToken,
}

/// Starts `plan` on its own task; its items come on the returned stream. The run stops (and cleans up)
/// when the receiver goes away or the gateway shuts down.
pub(crate) fn start(gateway: Gateway, plan: Plan) -> mpsc::Receiver<Result<pb::EvaluateItem, Status>> {
    let (tx, rx) = mpsc::channel(16);
    let cancel = CancellationToken::new();
    let scratch = Scratch::new(gateway.clone(), plan.tenant.clone(), plan.run_id.clone(), cancel.clone());
    let run = Arc::new(Run { gateway, plan, scratch, cancel });
    tokio::spawn(async move {
        let watcher = {
            let (tx, cancel, shutdown) = (tx.clone(), run.cancel.clone(), run.gateway.shutdown.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = tx.closed() => cancel.cancel(),
                    () = shutdown.cancelled() => cancel.cancel(),
                    () = cancel.cancelled() => {}
                }
            })
        };
        run.clone().drive(&tx).await;
        watcher.abort();
    });
    rx
}

fn item(item: pb::evaluate_item::Item) -> Result<pb::EvaluateItem, Status> {
    Ok(pb::EvaluateItem { item: Some(item) })
}

impl Run {
    async fn drive(self: Arc<Self>, tx: &mpsc::Sender<Result<pb::EvaluateItem, Status>>) {
        let plan = &self.plan;
        let started = pb::EvalStarted {
            run_id: plan.run_id.clone(),
            total: plan.selected.len() as u32,
            parallel: plan.parallel as u32,
            scratch_label: format!("{}={}", super::scratch::EVAL_LABEL, plan.run_id),
            agent: plan.candidate.agent.clone(),
            version: plan.candidate.version.unwrap_or(0),
            scorer: plan.scorer.name().to_owned(),
        };
        let _ = tx.send(item(pb::evaluate_item::Item::Started(started))).await;
        let mut totals = Totals::new(plan.selected.len());
        let rows = futures::stream::iter(plan.selected.iter().cloned().enumerate())
            .map(|(index, selected)| self.clone().row(index as u32, selected))
            .buffer_unordered(plan.parallel);
        futures::pin_mut!(rows);
        while let Some(row) = rows.next().await {
            totals.add(&row);
            if tx.send(item(pb::evaluate_item::Item::Row(row))).await.is_err() {
                self.cancel.cancel();
            }
        }
        let (deleted, left) = self.scratch.delete_all().await;
        if !self.cancel.is_cancelled() {
            let summary = totals.summary(&plan.run_id, deleted, left);
            let _ = tx.send(item(pb::evaluate_item::Item::Summary(summary))).await;
        }
    }

    /// One selected turn rerun and scored; a turn that cannot be run is a row with `error`.
    async fn row(self: Arc<Self>, index: u32, selected: Selected) -> pb::EvalRow {
        let Selected { session, record } = selected;
        let mut row = pb::EvalRow {
            index,
            session: Some(encode_session_ref(&session)),
            turn: record.turn,
            input: record.input_text(),
            ..Default::default()
        };
        let recorded_score = if self.plan.scorer.is_reference_based() {
            None
        } else {
            Some(self.score(index, &session, "recorded", &record, &record).await)
        };
        row.recorded = Some(record.encode(recorded_score));
        match self.candidate(index, &session, &record).await {
            Ok(candidate) => {
                let score = self.score(index, &session, "candidate", &candidate, &record).await;
                row.candidate = Some(candidate.encode(Some(score)));
            }
            Err(why) => row.error = why,
        }
        row
    }

    /// Waits until the tenant's request rate admits one more turn, and checks its token budget.
    async fn admit(&self) -> Result<(), Failed> {
        let tenant = self.plan.tenant.as_str();
        loop {
            match self.gateway.quotas.admit(tenant).await {
                Ok(()) => break,
                Err(refused) => {
                    let wait_ms = refused
                        .metadata()
                        .get(RETRY_AFTER_MS)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(100);
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(wait_ms.max(1))) => {}
                        () = self.cancel.cancelled() => return Err("cancelled".into()),
                    }
                }
            }
        }
        if self.gateway.budget_used_up(&self.plan.tenant).await {
            return Err(super::BUDGET_USED_UP.to_owned());
        }
        Ok(())
    }

    /// The turn's input run on the candidate profile in a scratch session forked at the turn's start.
    async fn candidate(&self, index: u32, source: &SessionRef, record: &TurnRecord) -> Result<TurnRecord, Failed> {
        self.admit().await?;
        let fork = self.fork_before(source, record.turn).await?;
        let session = self.scratch.open(&index.to_string(), fork, &self.plan.candidate).await?;
        let ran = self.scratch.run_turn(&session, &record.input, self.plan.turn_timeout).await;
        // Deleted now so a long run does not pile them up; on failure `delete_all` tries again.
        let _ = self.scratch.delete(&session).await;
        ran
    }

    /// The fork of `source` at the start of `turn`: through its turn before (none before turn 1).
    async fn fork_before(&self, source: &SessionRef, turn: u64) -> Result<Option<Fork>, Failed> {
        if turn <= 1 {
            return Ok(None);
        }
        crate::history::fork_of(self.gateway.log.as_ref(), source, turn - 1)
            .await
            .map(Some)
            .map_err(|e| format!("fork: {}", e.message()))
    }

    async fn score(
        &self,
        index: u32,
        session: &SessionRef,
        side: &str,
        reply: &TurnRecord,
        recorded: &TurnRecord,
    ) -> pb::EvalScore {
        match &self.plan.scorer {
            Scorer::Exact => scorer::exact(&reply.reply, &recorded.reply),
            Scorer::Contains { texts, ignore_case } => {
                scorer::contains(&reply.reply, &recorded.reply, texts, *ignore_case)
            }
            Scorer::JsonSchema(validator) => scorer::json_schema(&reply.reply, validator),
            Scorer::Judge { instructions, .. } => match self.judge(index, side, instructions, recorded, reply).await {
                Ok(s) => s,
                Err(why) => scorer::score(0.0, format!("the judge failed: {why}")),
            },
            Scorer::Hook { .. } => {
                let Some(hook) = &self.plan.hook else {
                    return scorer::score(0.0, "no hook client; this is a bug");
                };
                let input = recorded.input_text();
                let request = HookRequest {
                    session: session.to_string(),
                    turn: recorded.turn,
                    side,
                    input: &input,
                    reply: &reply.reply,
                    recorded_reply: &recorded.reply,
                    tools: &reply.tools,
                };
                hook.score(&request).await
            }
        }
    }

    /// The judge's score of `reply`, from a turn of its own in a scratch session.
    async fn judge(
        &self,
        index: u32,
        side: &str,
        instructions: &str,
        recorded: &TurnRecord,
        reply: &TurnRecord,
    ) -> Result<pb::EvalScore, Failed> {
        let Some(judge) = &self.plan.judge else { return Err("no judge agent; this is a bug".into()) };
        self.admit().await?;
        let session = self.scratch.open(&format!("{index}-judge-{side}"), None, judge).await?;
        let prompt = scorer::judge_prompt(instructions, &recorded.input_text(), &reply.reply);
        let mut message = turnstile_model::message::UserMessage::user_text("judge", &prompt);
        message.push_block(turnstile_model::output::block(&scorer::judge_schema()));
        let ran = self.scratch.run_turn(&session, &[message], self.plan.turn_timeout).await;
        let _ = self.scratch.delete(&session).await;
        let answer = ran?;
        if answer.end_reason != "completed" {
            return Err(format!("its turn ended {}", answer.end_reason));
        }
        Ok(scorer::judge_answer(&answer.reply))
    }
}
