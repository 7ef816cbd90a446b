//! SPEC §17 through the worker's host on real providers (fake servers on loopback): a request that fails
//! before its first byte goes on to the model's `fallback`, and the `assistant/message` names the model that
//! answered; a tenant over its daily `token_budget` gets the typed turn end without the model being called,
//! while another tenant's agent keeps running; the usage a journal counts is what its durable
//! `assistant/message`s record.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod provider_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use provider_support::{FakeServer, Reply, openai_text_reply};
use turnstile_agent::setup::from_config_with_env;
use turnstile_cluster::CommandRouter;
use turnstile_config::Config;
use turnstile_journal::{EmbeddedLog, LiveBus, LocalBus, UsageLedger};
use turnstile_model::usage::day_of;
use turnstile_model::{
    Command, Envelope, EventPayload, LivePayload, ModelRef, SessionRef, Target, TurnEndReason, Usage, UserMessage,
};
use turnstile_worker::SessionHost;
use turnstile_worker::budget::Budgets;

/// A host on an in-memory journal for `config`, with the tenants' `token_budget`s checked.
fn host(config: &str) -> (Arc<SessionHost>, Arc<EmbeddedLog>, Arc<LocalBus>) {
    let config = Config::from_toml_str(config).unwrap();
    let setup = from_config_with_env(&config, |_| None).unwrap();
    let log = Arc::new(EmbeddedLog::in_memory());
    let bus = Arc::new(LocalBus::new());
    let budgets: BTreeMap<String, u64> =
        config.tenants.iter().filter_map(|(name, t)| Some((name.clone(), t.token_budget?))).collect();
    let host = SessionHost::builder(log.clone(), bus.clone(), setup.into())
        .budgets(Budgets::new(budgets, log.usage()))
        .build();
    (host, log, bus)
}

/// Sends `text` to `session` and waits until it is idle; the session's whole log.
async fn turn(host: &SessionHost, log: &EmbeddedLog, session: &SessionRef, id: &str, text: &str) -> Vec<Envelope> {
    let message = UserMessage::user_text(id, text);
    let send = Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None };
    host.execute(session, send, None).await.unwrap();
    host.execute(session, Command::WhenIdle, Some(Duration::from_secs(20))).await.unwrap();
    turnstile_journal::log::read_all(log, session, 1).await.unwrap()
}

fn last_turn_end(events: &[Envelope]) -> &TurnEndReason {
    events
        .iter()
        .rev()
        .find_map(|e| match &e.payload {
            EventPayload::TurnEnd { reason, .. } => Some(reason),
            _ => None,
        })
        .expect("a turn/end")
}

fn answers(events: &[Envelope]) -> Vec<(String, Option<ModelRef>, Option<Usage>)> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            EventPayload::AssistantMessage { text, model, usage, .. } => Some((text.clone(), model.clone(), *usage)),
            _ => None,
        })
        .collect()
}

fn models(primary: &FakeServer, backup: &FakeServer, primary_retries: u32) -> String {
    format!(
        "default_agent = \"assistant\"\n\
         [models.primary]\nbase_url = \"{}\"\nmodel = \"primary-model\"\nretries = {primary_retries}\n\
         fallback = [\"backup\"]\n\
         [models.backup]\nbase_url = \"{}\"\nmodel = \"backup-model\"\nretries = 0\n\
         [agents.assistant]\nmodel = \"primary\"\n",
        primary.base_url, backup.base_url
    )
}

#[tokio::test]
async fn after_503s_on_the_first_model_the_fallback_answers_and_the_message_names_it() {
    turnstile_ops::install_metrics().unwrap();
    let primary = FakeServer::openai(vec![Reply::error(503, "overloaded"); 3]).await;
    let backup = FakeServer::openai(vec![openai_text_reply("from the backup", 20, 4)]).await;
    let (host, log, _) = host(&models(&primary, &backup, 2));
    let session = SessionRef::new("acme", "fallback").unwrap();
    let events = turn(&host, &log, &session, "m1", "hello").await;

    assert_eq!(last_turn_end(&events), &TurnEndReason::Completed);
    let usage = Usage { input_tokens: 20, output_tokens: 4, ..Usage::default() };
    assert_eq!(
        answers(&events),
        [("from the backup".to_owned(), Some(ModelRef::new("openai", "backup-model")), Some(usage))]
    );
    // The first model got its own retries (1 + 2), then the same request went to the backup.
    assert_eq!(primary.requests().len(), 3);
    assert_eq!(backup.requests().len(), 1);
    assert_eq!(backup.requests()[0].body["model"], "backup-model");
    assert_eq!(backup.requests()[0].body["messages"], primary.requests()[0].body["messages"]);

    let metrics = turnstile_ops::render_metrics().unwrap();
    let line = |name: &str, labels: &[&str]| {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && labels.iter().all(|label| l.contains(label)))
            .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{metrics}"))
            .to_owned()
    };
    assert!(
        line("turnstile_model_fallbacks_total", &[r#"model="primary-model""#, "model_unavailable"]).ends_with(" 1")
    );
    let served = line("turnstile_model_requests_total", &[r#"model="backup-model""#, r#"outcome="ok""#]);
    assert!(served.contains(r#"tenant="acme""#) && served.ends_with(" 1"), "{served}");
    assert!(line("turnstile_model_tokens_total", &[r#"model="backup-model""#, r#"kind="input""#]).ends_with(" 20"));
}

#[tokio::test]
async fn a_refusal_or_a_failure_after_the_first_byte_does_not_fall_back() {
    let primary = FakeServer::openai(vec![Reply::error(400, "bad request")]).await;
    let backup = FakeServer::openai(vec![openai_text_reply("never", 1, 1)]).await;
    let (host, log, _) = host(&models(&primary, &backup, 0));
    let session = SessionRef::new("acme", "refused").unwrap();
    let events = turn(&host, &log, &session, "m1", "hello").await;
    assert!(matches!(last_turn_end(&events), TurnEndReason::Error { code, .. } if code == "model_refused"));
    assert!(backup.requests().is_empty());
}

#[tokio::test]
async fn when_every_model_fails_the_turn_ends_with_the_last_ones_error() {
    let primary = FakeServer::openai(vec![Reply::error(503, "down")]).await;
    let backup = FakeServer::openai(vec![Reply::error(429, "slow down")]).await;
    let (host, log, _) = host(&models(&primary, &backup, 0));
    let session = SessionRef::new("acme", "all-down").unwrap();
    let events = turn(&host, &log, &session, "m1", "hello").await;
    assert!(
        matches!(last_turn_end(&events), TurnEndReason::Error { code, .. } if code == "model_rate_limited"),
        "{:?}",
        last_turn_end(&events)
    );
    assert_eq!((primary.requests().len(), backup.requests().len()), (1, 1));
}

#[tokio::test]
async fn a_tenant_over_its_budget_gets_the_typed_turn_end_while_another_tenants_agent_keeps_running() {
    // acme may use 100 tokens a day; its first turn uses 150 (a request in flight is never cut), so its
    // next turn is refused before the model is called. other has no budget.
    let server = FakeServer::openai(vec![
        openai_text_reply("first", 120, 30),
        openai_text_reply("for other", 500, 500),
        openai_text_reply("again for other", 500, 500),
    ])
    .await;
    let config = format!(
        "default_agent = \"assistant\"\n[models.m]\nbase_url = \"{}\"\nmodel = \"m\"\nretries = 0\n\
         [agents.assistant]\nmodel = \"m\"\n[tenants.acme]\ntoken_budget = 100\n",
        server.base_url
    );
    let (host, log, bus) = host(&config);
    let acme = SessionRef::new("acme", "s").unwrap();
    let other = SessionRef::new("other", "s").unwrap();

    let events = turn(&host, &log, &acme, "m1", "hello").await;
    assert_eq!(last_turn_end(&events), &TurnEndReason::Completed);

    let mut live = bus.subscribe(&acme).await.unwrap();
    let events = turn(&host, &log, &acme, "m2", "and again").await;
    let TurnEndReason::Error { code, message } = last_turn_end(&events) else { panic!("{events:?}") };
    assert_eq!(code, "tenant_budget_exhausted");
    assert!(message.starts_with("tenant \"acme\" used 150 tokens today, its daily token budget is 100"), "{message}");
    assert!(message.contains("resets at ") && message.contains("T00:00:00.000Z"), "{message}");
    // The step was opened and closed; no assistant/message was written, and the model saw one request.
    let types: Vec<&str> = events.iter().rev().take(3).map(Envelope::event_type).collect();
    assert_eq!(types, ["agent/status", "turn/end", "step/end"]);
    assert_eq!(answers(&events).len(), 1);
    assert_eq!(server.requests().len(), 1);
    let error = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(event) = live.next().await {
            if let LivePayload::Error { message, .. } = event.payload {
                return message;
            }
        }
        String::new()
    })
    .await
    .unwrap();
    assert!(error.contains("token budget"), "{error}");

    // Another tenant runs on, twice; nothing of acme's session broke: it still takes deliveries.
    for (id, text) in [("o1", "for other"), ("o2", "again for other")] {
        let events = turn(&host, &log, &other, id, "go").await;
        assert_eq!(last_turn_end(&events), &TurnEndReason::Completed);
        assert_eq!(answers(&events).last().unwrap().0, text);
    }
    let events = turn(&host, &log, &acme, "m3", "still here?").await;
    assert!(matches!(last_turn_end(&events), TurnEndReason::Error { code, .. } if code == "tenant_budget_exhausted"));
    assert_eq!(server.requests().len(), 3);

    // The counted usage is what the durable messages record.
    let today = day_of(turnstile_ops::clock::now_ms());
    let ledger = log.usage();
    assert_eq!(ledger.tenant_usage("acme", today).await.unwrap().used_on(today), 150);
    assert_eq!(ledger.tenant_usage("other", today).await.unwrap().used_on(today), 2000);
}
