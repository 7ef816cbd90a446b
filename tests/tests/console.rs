//! The web console (decision 0029) in a real browser: `turnstile dev` with an agent that gates `echo`
//! behind approval and bearer-token auth, headless chromium (`browser::Chromium`), and
//! `console/test/browser.mjs` driving the page as a person would: the token field, the sessions list, a
//! streamed followup, queue / replace / remove in the inbox, cancel of a running turn, approve of a
//! waiting call, deny of another from the tenant's approvals inbox, the transcript page, the tenant's
//! memory (#/memory: listed and searched) and an agent's page (#/agents/NAME: its versions and the sessions
//! on each), and a screenshot under `target/console/`. Then the session's log, read over gRPC with the
//! same token, must hold exactly what the page did. And a streaming reply across a page reload and a
//! dropped connection (SPEC §14, `console/test/resume.mjs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tonic::Request;
use tonic::transport::Channel;
use turnstile_tests::browser::{Chromium, run_script};
use turnstile_tests::v1::agent_client::AgentClient;
use turnstile_tests::v1::cancel_cause::Cause;
use turnstile_tests::v1::session_event::Payload;
use turnstile_tests::v1::turn_end_reason::Reason;
use turnstile_tests::v1::watch_item::Item;
use turnstile_tests::v1::{
    ConfigureSessionRequest, CreateScheduleRequest, DeliverRequest, GetTranscriptRequest, PutAgentRequest,
    PutMemoryRequest, SchedulePreset, SessionEvent, SessionRef, SetLabelsRequest, SpliceOutcome, WatchRequest,
    WhenIdleRequest, create_schedule_request,
};
use turnstile_tests::{DevOptions, DevServer, text_of, user_msg};

const TOKEN: &str = "console-test-token-0123456789";
const TENANT: &str = "console-tenant";
/// `echo` waits for a human; `sleep` runs freely.
const CONFIG: &str =
    "default_agent = \"careful\"\n\n[agents.careful]\ntools = [\"echo\", \"sleep\"]\napproval = [\"echo\"]\n";

fn authed<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    request
}

/// The JSON summary a browser script prints as its last stdout line, once it exited 0 (else a failure with
/// its output and both logs).
fn summary_of(script: &str, out: &std::process::Output, browser: &Chromium, server: &DevServer) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stdout}\n{stderr}\n--- chromium log:\n{}\n--- turnstile log:\n{}",
        out.status,
        browser.log_tail(),
        server.log_tail()
    );
    eprintln!("{stdout}");
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

fn named(id: &str) -> Option<SessionRef> {
    Some(SessionRef { tenant: String::new(), id: id.into() })
}

/// The session's whole log, as any client reads it (with the test's token, or none when auth is off).
async fn log_of(client: &mut AgentClient<Channel>, id: &str, auth: bool) -> Vec<SessionEvent> {
    let req = WatchRequest { session: named(id), after_seq: 0, live: false, resume: None };
    let req = if auth { authed(req) } else { Request::new(req) };
    let mut stream = client.watch(req).await.unwrap().into_inner();
    let mut events = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        match item.item {
            Some(Item::Event(e)) => events.push(e),
            Some(Item::CaughtUp(_)) => return events,
            _ => {}
        }
    }
    panic!("the watch ended before caught_up");
}

#[tokio::test]
async fn the_console_drives_a_session_end_to_end_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN} {TENANT}\n")).unwrap();
    let args = ["--config", config.to_str().unwrap(), "--auth-tokens", tokens.to_str().unwrap()];
    let opts = DevOptions { extra_args: args.map(str::to_owned).to_vec(), ..DevOptions::default() };
    let server = DevServer::start_with(opts).await.unwrap();
    let mut client = server.client();

    // A session for the list to show, made by an ordinary gRPC client with the same token.
    let listed = format!("listed-{}", uuid::Uuid::new_v4());
    let req =
        DeliverRequest { session: named(&listed), message: Some(user_msg("listed-1", "hello")), output_schema: None };
    client.followup(authed(req)).await.unwrap();
    client.when_idle(authed(WhenIdleRequest { session: named(&listed), timeout_ms: 20_000 })).await.unwrap();
    // A label the list filters by, and a schedule the session's page shows with its next firing.
    let labels = [("team".to_owned(), "blue".to_owned())].into();
    client.set_labels(authed(SetLabelsRequest { session: named(&listed), labels, remove_keys: vec![] })).await.unwrap();
    let daily = CreateScheduleRequest {
        session: named(&listed),
        schedule_id: "daily".into(),
        preset: SchedulePreset::Followup.into(),
        message: Some(user_msg("", "report")),
        timing: Some(create_schedule_request::Timing::Cron("0 9 * * *".into())),
        time_zone: "Europe/Paris".into(),
        not_after_unix_ms: None,
        catchup_ms: 0,
    };
    client.create_schedule(authed(daily)).await.unwrap();
    // A memory document for #/memory, and an API agent with two versions and a session on each for its
    // page (SPEC §20).
    let put = PutMemoryRequest {
        tenant: String::new(),
        namespace: "notes".into(),
        key: "gate".into(),
        document: r#"{"fact": "the north gate opens at dawn"}"#.into(),
    };
    client.put_memory(authed(put)).await.unwrap();
    let agent = format!("helper-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (v1_session, v2_session) = (format!("{agent}-on-v1"), format!("{agent}-on-v2"));
    for (system, session) in [("You are v1.", &v1_session), ("You are v2.", &v2_session)] {
        let definition = format!("system = \"{system}\"\nversion_policy = \"pin\"");
        client.put_agent(authed(PutAgentRequest { name: agent.clone(), definition, format: 0 })).await.unwrap();
        let configure = ConfigureSessionRequest { session: named(session), agent: agent.clone(), ..Default::default() };
        client.configure_session(authed(configure)).await.unwrap();
    }

    let browser = Chromium::start().await.unwrap();
    let shots = turnstile_tests::binary::target_dir().join("console");
    std::fs::create_dir_all(&shots).unwrap();
    let screenshot = shots.join("session.png");
    let _ = std::fs::remove_file(&screenshot);
    let session = format!("console-{}", uuid::Uuid::new_v4());
    let http = server.http_addr().expect("dev serves --http");
    let env = [
        ("CDP_ENDPOINT", browser.ws_endpoint().to_owned()),
        ("CONSOLE_URL", format!("http://{http}/")),
        ("TURNSTILE_TOKEN", TOKEN.to_owned()),
        ("SESSION_ID", session.clone()),
        ("LISTED_SESSION", listed.clone()),
        ("SCREENSHOT", screenshot.display().to_string()),
        ("AGENT_NAME", agent.clone()),
        ("AGENT_V1_SESSION", v1_session.clone()),
        ("AGENT_V2_SESSION", v2_session.clone()),
    ];
    let env = env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let out = run_script("browser.mjs", env, Duration::from_secs(180)).await.unwrap();
    let summary = summary_of("browser.mjs", &out, &browser, &server);
    let png = std::fs::read(&screenshot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "{} is no screenshot", screenshot.display());

    // The log holds what the page did, in order.
    let events = log_of(&mut client, &session, true).await;
    let entered: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::UserMessage(u)) => u.message.as_ref().map(|m| (m.id.clone(), text_of(m))),
            _ => None,
        })
        .collect();
    let texts: Vec<&str> = entered.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        texts,
        [
            "[[delay:1500]] [[usage:12,3]] hello from the browser",
            "queued, then replaced",
            "after the queue",
            "[[tool:sleep 60000]] a long one",
            "[[tool:echo approved in the browser]] please",
            "and then summarise",
            "[[tool:echo from the inbox]] once more",
        ],
        "the messages the page sent, the queued one as replaced"
    );
    assert_eq!(entered[1].0, summary["queuedId"].as_str().unwrap(), "replace kept the message's id");

    // The streamed reply: what the page showed is the durable text, and it came in several deltas.
    let first_reply = events.iter().find_map(|e| match &e.payload {
        Some(Payload::AssistantMessage(a)) if a.turn == 1 => Some(a.text.clone()),
        _ => None,
    });
    assert_eq!(first_reply.as_deref(), summary["replyText"].as_str());
    assert!(summary["replyText"].as_str().unwrap().contains("hello from the browser"), "{summary}");
    assert!(summary["deltas"].as_u64().unwrap() >= 2, "the page saw the reply stream: {summary}");

    // Remove: one canceled splice that removed exactly that message.
    let removed = summary["removedId"].as_str().unwrap();
    let mut inserted_removed = false;
    let mut canceled = 0;
    for e in &events {
        if let Some(Payload::InboxSpliced(s)) = &e.payload {
            inserted_removed |= s.inserted.iter().any(|m| m.id == removed);
            if s.outcome == SpliceOutcome::Canceled as i32 && s.inserted.is_empty() {
                canceled += 1;
            }
        }
    }
    assert!(inserted_removed, "the removed message was queued first");
    assert_eq!(canceled, 1, "one removal (replace inserts, so it is not counted)");

    // Turns: three completed, the cancelled one aborted by the user, the approved one and the followup
    // that waited for it completed.
    let ends: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::TurnEnd(t)) => Some(match t.reason.as_ref().and_then(|r| r.reason.as_ref()) {
                Some(Reason::Completed(_)) => "completed".to_owned(),
                Some(Reason::Aborted(c)) if matches!(c.cause, Some(Cause::User(_))) => "aborted{user}".to_owned(),
                other => format!("{other:?}"),
            }),
            _ => None,
        })
        .collect();
    assert_eq!(ends, ["completed", "completed", "completed", "aborted{user}", "completed", "completed", "completed"]);

    // The approval: the page's Decide approved the call it showed.
    let call = summary["callId"].as_str().unwrap();
    let decided =
        events.iter().any(|e| matches!(&e.payload, Some(Payload::ToolDecision(d)) if d.call_id == call && d.approved));
    assert!(decided, "tool/decision approved for {call}");
    let result = events.iter().find_map(|e| match &e.payload {
        Some(Payload::ToolResult(r)) if r.call_id == call => Some(r.output.clone()),
        _ => None,
    });
    assert_eq!(result.as_deref(), Some("approved in the browser"));

    // The approvals inbox: the page's Decide denied the call it listed, with the reason typed there.
    let denied = summary["deniedCall"].as_str().unwrap();
    let decision = events.iter().find_map(|e| match &e.payload {
        Some(Payload::ToolDecision(d)) if d.call_id == denied => Some(d.clone()),
        _ => None,
    });
    let decision = decision.expect("a tool/decision for the denied call");
    assert!(!decision.approved && !decision.timed_out, "{decision:?}");
    assert_eq!(decision.reason, "not from the inbox");

    // The transcript page showed exactly the items GetTranscript answers, in order.
    let mut items = Vec::new();
    let mut after_seq = 0;
    loop {
        let req = GetTranscriptRequest { session: named(&session), after_seq, page_size: 1000 };
        let page = client.get_transcript(authed(req)).await.unwrap().into_inner();
        items.extend(page.items.iter().map(|i| i.seq));
        if page.next_seq == 0 {
            break;
        }
        after_seq = page.next_seq;
    }
    let shown: Vec<u64> = summary["transcriptSeqs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(shown, items, "the seqs of the items the transcript page showed");

    // The agent's page listed exactly the session recorded on each version.
    assert_eq!(summary["onV1"], serde_json::json!([v1_session]), "{summary}");
    assert_eq!(summary["onV2"], serde_json::json!([v2_session]), "{summary}");
}

/// SPEC §14 in the browser: a page reloaded mid-reply shows the reply's partial text at once (the output
/// so far comes right after caught_up) and keeps streaming; a dropped connection (the script's proxy cuts
/// the page's connections) reopens the Watch from the bytes the page shows. Every text the step showed is a
/// prefix of the durable reply: nothing repeated, nothing skipped.
#[tokio::test]
async fn the_console_keeps_a_streaming_reply_across_a_reload_and_a_dropped_connection() {
    let server = DevServer::start().await.unwrap();
    let mut client = server.client();
    let browser = Chromium::start().await.unwrap();
    let session = format!("resume-{}", uuid::Uuid::new_v4());
    let http = server.http_addr().expect("dev serves --http");
    let env = [
        ("CDP_ENDPOINT", browser.ws_endpoint().to_owned()),
        ("CONSOLE_URL", format!("http://{http}/")),
        ("SESSION_ID", session.clone()),
    ];
    let env = env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let out = run_script("resume.mjs", env, Duration::from_secs(90)).await.unwrap();
    let summary = summary_of("resume.mjs", &out, &browser, &server);
    let text = |key: &str| summary[key].as_str().unwrap_or_else(|| panic!("{key} in {summary}")).to_owned();

    let events = log_of(&mut client, &session, false).await;
    let reply = events
        .iter()
        .find_map(|e| match &e.payload {
            Some(Payload::AssistantMessage(a)) if a.turn == 1 => Some(a.text.clone()),
            _ => None,
        })
        .expect("the reply's assistant/message");
    assert_eq!(text("replyText"), reply, "the page shows the durable reply");
    let (before_reload, after_reload) = (text("beforeReload"), text("afterReload"));
    assert!(
        after_reload.starts_with(&before_reload) && reply.starts_with(&after_reload),
        "the reloaded page showed the partial text at once: {before_reload:?} before the reload, \
         {after_reload:?} first after it; the reply is {reply:?}"
    );
    let (before_cut, after_cut) = (text("beforeCut"), text("afterCut"));
    assert!(after_cut.len() > before_cut.len() && after_cut.starts_with(&before_cut), "{summary}");
    assert_eq!(summary["reconnected"], true, "the page's Watch reopened over a new connection: {summary}");
    let shown = summary["shown"].as_array().expect("the states the reply was shown in");
    assert!(shown.len() >= 3, "the reply streamed in after the reload: {summary}");
    for state in shown {
        let t = state["text"].as_str().unwrap();
        assert!(reply.starts_with(t), "the page showed {t:?}, which is not a prefix of the reply {reply:?}");
    }
}
