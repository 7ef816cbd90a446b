//! Issue 37 item 5 on the real binary (decision 0086): a step cancelled mid-stream is counted. Its
//! `step/end` records what the provider reported (the scripted model reports its input when it starts, as
//! Anthropic's `message_start` does) and the output streamed so far as an estimate; `GetUsage` counts it,
//! the tenant's budget sees it, and on JetStream the count survives a restart.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::turn_end_reason::Reason;
use turnstile_proto::v1::{GetUsageRequest, SessionEvent, SessionRef, TenantUsage};
use turnstile_tests::{Backend, DevOptions, DevServer, NatsServer, Session, user_msg};

const TENANT: &str = "metered";

async fn usage(server: &DevServer) -> TenantUsage {
    let request = GetUsageRequest { tenant: TENANT.into(), since_unix_ms: 0 };
    server.client().get_usage(request).await.unwrap().into_inner()
}

fn totals(u: &TenantUsage) -> (u64, u64) {
    u.models.iter().fold((0, 0), |(i, o), m| (i + m.input_tokens, o + m.output_tokens))
}

/// The tenant's counted (input, output) once it is `want` (JetStream folds the log into its usage bucket
/// in the background), or the last answer after 15 s.
async fn counted(server: &DevServer, want: (u64, u64)) -> (u64, u64) {
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let got = totals(&usage(server).await);
        if got == want || Instant::now() > until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The usage recorded on the `step/end`s of `events`, and whether any of it is an estimate.
fn spent_on_step_ends(events: &[SessionEvent]) -> ((u64, u64), bool) {
    events.iter().fold(((0, 0), false), |((i, o), estimated), e| match &e.payload {
        Some(Payload::StepEnd(end)) => match end.usage {
            Some(u) => ((i + u.input_tokens, o + u.output_tokens), estimated || end.usage_estimated),
            None => ((i, o), estimated),
        },
        _ => ((i, o), estimated),
    })
}

async fn a_step_cancelled_mid_stream_is_counted_in_usage_and_against_the_budget(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(&config, format!("[tenants.{TENANT}]\ntoken_budget = 900\n")).unwrap();
    // A journal that outlives the server, so a restarted one reads the same logs.
    let nats = match backend {
        Backend::Nats => Some(NatsServer::start().await.unwrap()),
        Backend::Embedded => None,
    };
    let options = || DevOptions {
        extra_args: vec!["--config".into(), config.display().to_string()],
        nats_url: nats.as_ref().map(NatsServer::url),
        data_dir: nats.is_none().then(|| dir.path().join("data")),
        ..DevOptions::default()
    };
    let server = DevServer::start_with(options()).await.unwrap();
    let session = Session::with_ref(server.client(), SessionRef { tenant: TENANT.into(), id: "s".into() });

    // A reply that reports 900 input tokens and streams slowly; cancelled once its first words arrived.
    let watch = session.watch().await.unwrap();
    let long = "word ".repeat(200);
    session.followup(user_msg("m1", &format!("[[usage:900,400]] [[delay:20000]] {long}"))).await.unwrap();
    watch.wait_line("L delta 1.1*").await.unwrap();
    session.cancel(false).await.unwrap();
    watch.wait_line("D turn/end 1 aborted*").await.unwrap();

    let (events, _) = session.replay(0).await.unwrap();
    let ((input, output), estimated) = spent_on_step_ends(&events);
    assert_eq!(input, 900, "the input the model reported before the cut");
    assert!(output > 0 && output < 400, "the output streamed before the cut, estimated: {output}");
    assert!(estimated, "the output is an estimate");
    assert_eq!(counted(&server, (900, output)).await, (900, output), "GetUsage counts the cancelled step");

    // The budget sees it: 900 + the streamed output is over 900, so the next request is not sent.
    session.followup(user_msg("m2", "[[usage:1,1]] again")).await.unwrap();
    watch.wait_line("D turn/end 2 error*").await.unwrap();
    let (events, _) = session.replay(0).await.unwrap();
    let reason = events.iter().rev().find_map(|e| match &e.payload {
        Some(Payload::TurnEnd(end)) => end.reason.clone()?.reason,
        _ => None,
    });
    let Some(Reason::Error(error)) = reason else { panic!("{reason:?}") };
    assert_eq!(error.code, "tenant_budget_exhausted", "{}", error.message);

    // The count is the log's: a restarted server on the same journal counts it again.
    server.stop().await;
    let restarted = DevServer::start_with(options()).await.unwrap();
    assert_eq!(counted(&restarted, (900, output)).await, (900, output), "counted from the log after a restart");
    restarted.stop().await;
}

turnstile_tests::backend_tests!(a_step_cancelled_mid_stream_is_counted_in_usage_and_against_the_budget);
