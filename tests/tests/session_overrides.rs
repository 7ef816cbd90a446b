//! SPEC §20 session overrides against the real binary in a cluster (one nats-server, two workers, one
//! gateway): `ConfigureSession` sets an extra system prompt, a model from the agent's list and a subset of
//! its tools; `GetSession` shows them; the next turn answers with the extra prompt after the agent's (the
//! scripted model's `[[system]]` directive) on the chosen model (the `assistant/message`'s model), and a
//! tool outside the subset is refused; overrides the agent does not allow, a model not in its list and a
//! tool it does not have are refused naming the field; and all of it holds after a kill -9 of the owner.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::Code;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::{
    AssistantMessage, ConfigureSessionRequest, InjectMode, ModelRef, SessionInfo, SessionOverrides, ToolResult,
    ToolSubset,
};
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::{Cluster, ClusterOptions, Session, user_msg};

const CONFIG: &str = r#"
[models.large]
provider = "scripted"

[agents.helper]
system = "Be brief."
tools = ["clock", "echo"]

[agents.helper.overrides]
system_prompt = true
models = ["large"]
tools = true

[agents.plain]
tools = ["clock"]
"#;

fn overrides(system_prompt: Option<&str>, model: Option<&str>, tools: Option<&[&str]>) -> SessionOverrides {
    SessionOverrides {
        system_prompt: system_prompt.map(str::to_owned),
        model: model.map(str::to_owned),
        tools: tools.map(|t| ToolSubset { tools: t.iter().map(|s| (*s).to_owned()).collect() }),
    }
}

async fn configure(s: &Session, agent: &str, o: SessionOverrides) -> Result<SessionInfo, tonic::Status> {
    let req = ConfigureSessionRequest {
        session: Some(s.reference()),
        agent: agent.into(),
        inject_mode: InjectMode::Pending as i32,
        overrides: Some(o),
        ..Default::default()
    };
    s.client().configure_session(req).await.map(tonic::Response::into_inner)
}

/// Runs one turn of `text` and returns its events.
async fn turn(s: &Session, id: &str, text: &str) -> Vec<Payload> {
    let before = s.info().await.map(|i| i.last_seq).unwrap_or(0);
    s.followup(user_msg(id, text)).await.unwrap();
    s.when_idle().await.unwrap();
    s.replay(before).await.unwrap().0.into_iter().filter_map(|e| e.payload).collect()
}

fn replies(events: &[Payload]) -> Vec<AssistantMessage> {
    events
        .iter()
        .filter_map(|p| match p {
            Payload::AssistantMessage(a) => Some(a.clone()),
            _ => None,
        })
        .collect()
}

fn results(events: &[Payload]) -> Vec<ToolResult> {
    events
        .iter()
        .filter_map(|p| match p {
            Payload::ToolResult(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// One `[[system]]` turn: the reply text and the model that answered.
async fn ask(s: &Session, id: &str) -> (String, Option<ModelRef>) {
    let events = turn(s, id, "[[system]] who are you?").await;
    let reply = replies(&events).pop().expect("a reply");
    (reply.text, reply.model)
}

#[tokio::test]
async fn a_session_runs_the_overrides_its_agent_allows_across_a_worker_kill() {
    let (_dir, path) = config_file(CONFIG);
    let mut opts = ClusterOptions::new(2, 1);
    opts.worker_args = config_args(&path);
    opts.gateway_args = config_args(&path);
    let mut cluster = Cluster::start_with(opts).await.unwrap();
    cluster.wait_balanced().await.unwrap();
    let s = cluster.session(0);

    // Refused precisely, and nothing written.
    let err = configure(&s, "helper", overrides(None, Some("huge"), None)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(err.message().starts_with("overrides.model: \"huge\" is not one of the models"), "{}", err.message());
    let err = configure(&s, "helper", overrides(None, None, Some(&["echo", "sleep"]))).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(err.message().starts_with("overrides.tools[1]: \"sleep\" is not one of"), "{}", err.message());
    let err = configure(&s, "plain", overrides(Some("extra"), None, None)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().starts_with("overrides.system_prompt: agent \"plain\" does not allow"), "{}", err.message());
    let err = configure(&s, "helper", overrides(None, Some(""), None)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(err.message().contains("overrides.model"), "{}", err.message());
    assert_eq!(s.info().await.unwrap_err().code(), Code::NotFound, "no refused configure wrote anything");

    // Set, recorded and shown.
    let set = overrides(Some("Answer in French."), Some("large"), Some(&["echo"]));
    let info = configure(&s, "helper", set.clone()).await.unwrap();
    assert_eq!(info.overrides.as_ref(), Some(&set));
    let (events, _) = s.replay(0).await.unwrap();
    let recorded: Vec<&str> = events.iter().map(|e| e.r#type.as_str()).collect();
    assert_eq!(recorded, ["session/configured", "session/overridden"]);
    assert!(events[1].ignorable, "older readers skip it");

    // The next turn: the extra prompt after the agent's, on the chosen model.
    let large = Some(ModelRef { provider: "scripted".into(), model: "large".into() });
    assert_eq!(ask(&s, "a1").await, ("system: Be brief.\n\nAnswer in French.".to_owned(), large.clone()));
    // A tool of the subset runs; one outside it is refused.
    let echoed = results(&turn(&s, "a2", "[[tool:echo in the subset]] go").await);
    assert_eq!((echoed[0].output.as_str(), echoed[0].error.as_deref()), ("in the subset", None));
    let refused = results(&turn(&s, "a3", "[[tool:clock]] go").await);
    let error = refused[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("tool clock is not available to this session (its tools: echo)"), "{refused:?}");

    // The owner dies; the next owner folds the overrides from the log and runs them.
    let owner = s.info().await.unwrap().owner;
    let victim = cluster.worker_index(&owner).unwrap_or_else(|| panic!("{owner:?} is not a worker"));
    cluster.kill9_worker(victim);
    let after = loop {
        match s.followup(user_msg("b1", "[[system]] still you?")).await {
            Ok(_) => break s.when_idle().await.unwrap(),
            Err(status) if status.code() == Code::Unavailable => {}
            Err(status) => panic!("followup after the kill failed: {status:?}"),
        }
    };
    assert_ne!(after.owner, owner, "another worker owns the session");
    assert_eq!(s.info().await.unwrap().overrides.as_ref(), Some(&set), "GetSession folds them from the log");
    let (events, _) = s.replay(0).await.unwrap();
    let last = events.iter().rev().find_map(|e| match &e.payload {
        Some(Payload::AssistantMessage(a)) => Some(a.clone()),
        _ => None,
    });
    let last = last.unwrap();
    assert_eq!((last.text.as_str(), last.model), ("system: Be brief.\n\nAnswer in French.", large));
    let refused = results(&turn(&s, "b2", "[[tool:clock]] go").await);
    assert!(refused[0].error.is_some(), "still outside the subset: {refused:?}");

    // A configure without overrides clears them: the agent's own prompt and model again.
    let info = configure(&s, "helper", SessionOverrides::default()).await.unwrap();
    assert_eq!(info.overrides, None);
    let (text, model) = ask(&s, "c1").await;
    assert_eq!(text, "system: Be brief.");
    assert_eq!(model.map(|m| m.model).as_deref(), Some("scripted"));
}
