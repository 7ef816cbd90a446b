//! SPEC §20 against the real binary: agents put through the API as versioned objects of a tenant, sessions
//! pinned to a version, the agent changed, pinned sessions answering as before and new ones as the new
//! version, `MigrateSessions` moving a label-selected set, and another tenant unable to see, use or
//! change the agent. The scripted model's `[[system]]` directive answers with the system prompt, which
//! shows the version that answered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::transcript_item::Item;
use turnstile_proto::v1::turn_end_reason::Reason;
use turnstile_proto::v1::{
    AgentInfo, ConfigureSessionRequest, DeleteAgentRequest, DeliverRequest, GetAgentRequest, GetTranscriptRequest,
    ListAgentVersionsRequest, ListAgentsRequest, ListSessionsRequest, MigrateSessionsRequest, PutAgentRequest,
    SessionInfo, SessionRef, SetLabelsRequest, WhenIdleRequest,
};
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::{DevOptions, DevServer, user_msg};

const TOKEN_A: &str = "agents-tenant-a-0123456789";
const TOKEN_B: &str = "agents-tenant-b-0123456789";

/// `message` with `token` as its bearer token (none when empty: auth is off).
fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    if !token.is_empty() {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

fn own(id: &str) -> Option<SessionRef> {
    Some(SessionRef { tenant: String::new(), id: id.into() })
}

async fn put(
    client: &mut AgentClient<Channel>,
    token: &str,
    name: &str,
    definition: &str,
) -> Result<AgentInfo, Status> {
    let req = PutAgentRequest { name: name.into(), definition: definition.into(), format: 0 };
    client.put_agent(authed(req, token)).await.map(tonic::Response::into_inner)
}

async fn get(client: &mut AgentClient<Channel>, token: &str, name: &str) -> Result<AgentInfo, Status> {
    let req = GetAgentRequest { name: name.into(), version: 0 };
    client.get_agent(authed(req, token)).await.map(tonic::Response::into_inner)
}

async fn configure(
    client: &mut AgentClient<Channel>,
    token: &str,
    id: &str,
    agent: &str,
) -> Result<SessionInfo, Status> {
    let req = ConfigureSessionRequest { session: own(id), agent: agent.into(), ..Default::default() };
    client.configure_session(authed(req, token)).await.map(tonic::Response::into_inner)
}

/// Runs one turn of `text` to its end.
async fn turn(client: &mut AgentClient<Channel>, token: &str, id: &str, text: &str) {
    let message = user_msg(&uuid::Uuid::new_v4().to_string(), text);
    client
        .followup(authed(DeliverRequest { session: own(id), message: Some(message), output_schema: None }, token))
        .await
        .unwrap();
    client.when_idle(authed(WhenIdleRequest { session: own(id), timeout_ms: 20_000 }, token)).await.unwrap();
}

/// Runs one turn of `[[system]]` and returns the reply: `system: PROMPT` of the version that answered.
async fn ask(client: &mut AgentClient<Channel>, token: &str, id: &str) -> String {
    turn(client, token, id, "[[system]] who are you?").await;
    let req = GetTranscriptRequest { session: own(id), after_seq: 0, page_size: 1000 };
    let items = client.get_transcript(authed(req, token)).await.unwrap().into_inner().items;
    items
        .into_iter()
        .filter_map(|i| match i.item {
            Some(Item::Assistant(a)) => Some(a.text),
            _ => None,
        })
        .next_back()
        .expect("an assistant message")
}

/// The reason the session's last turn ended.
async fn last_turn_end(client: &mut AgentClient<Channel>, token: &str, id: &str) -> Option<Reason> {
    let req = GetTranscriptRequest { session: own(id), after_seq: 0, page_size: 1000 };
    let items = client.get_transcript(authed(req, token)).await.unwrap().into_inner().items;
    items
        .into_iter()
        .filter_map(|i| match i.item {
            Some(Item::TurnEnd(end)) => end.reason.and_then(|r| r.reason),
            _ => None,
        })
        .next_back()
}

/// Runs a turn of `text` and returns the first tool result's output or error.
async fn tool_result(client: &mut AgentClient<Channel>, token: &str, id: &str, text: &str) -> String {
    turn(client, token, id, text).await;
    let req = GetTranscriptRequest { session: own(id), after_seq: 0, page_size: 1000 };
    let items = client.get_transcript(authed(req, token)).await.unwrap().into_inner().items;
    items
        .into_iter()
        .find_map(|i| match i.item {
            Some(Item::ToolResult(r)) => Some(format!("{} {}", r.output, r.error.unwrap_or_default())),
            _ => None,
        })
        .expect("a tool result")
}

#[tokio::test]
async fn pinned_sessions_answer_as_their_version_and_migrate_at_their_next_turn_and_other_tenants_see_nothing() {
    // `down` is a model no file agent uses, at a port where nothing listens: a version on it shows that each
    // version runs on its own model.
    let (dir, path) = config_file(
        "[models.other]\nprovider = \"scripted\"\n\
         [models.down]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\nretries = 0\n",
    );
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")).unwrap();
    let mut args = config_args(&path);
    args.extend(["--auth-tokens".to_owned(), tokens.display().to_string()]);
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let mut c = server.client();

    // A bad definition is refused as the file refuses it, naming the key.
    let bad = put(&mut c, TOKEN_A, "helper", "modle = \"other\"").await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(
        bad.message().starts_with("agents.helper.modle: unknown key (allowed: description, model, "),
        "{}",
        bad.message()
    );
    let bad = put(&mut c, TOKEN_A, "helper", r#"{"model": "gpt"}"#).await.unwrap_err();
    assert_eq!(bad.message(), r#"agents.helper.model: no model named "gpt" (known: down, other, scripted)"#);

    // v1, pinned; two sessions labelled for a migration, one outside it.
    let v1 = put(&mut c, TOKEN_A, "helper", "system = \"You are v1.\"\nversion_policy = \"pin\"").await.unwrap();
    assert_eq!((v1.version, v1.from_file, v1.version_policy.as_str()), (1, false, "pin"));
    for (id, group) in [("s1", "x"), ("s2", "x"), ("s3", "y")] {
        assert_eq!(configure(&mut c, TOKEN_A, id, "helper").await.unwrap().agent_version, 1);
        let labels = SetLabelsRequest {
            session: own(id),
            labels: [("group".into(), group.into())].into(),
            ..Default::default()
        };
        c.set_labels(authed(labels, TOKEN_A)).await.unwrap();
        assert_eq!(ask(&mut c, TOKEN_A, id).await, "system: You are v1.");
    }

    // v2: a new system prompt and model. An unchanged put is no new version.
    let v2_text = r#"{"system": "You are v2.", "model": "other", "version_policy": "pin"}"#;
    assert_eq!(put(&mut c, TOKEN_A, "helper", v2_text).await.unwrap().version, 2);
    assert_eq!(put(&mut c, TOKEN_A, "helper", v2_text).await.unwrap().version, 2);
    let versions = c
        .list_agent_versions(authed(ListAgentVersionsRequest { name: "helper".into() }, TOKEN_A))
        .await
        .unwrap()
        .into_inner()
        .versions;
    assert_eq!(versions.iter().map(|v| v.version).collect::<Vec<_>>(), [1, 2]);

    // Pinned sessions answer as v1; a new session runs v2.
    assert_eq!(ask(&mut c, TOKEN_A, "s1").await, "system: You are v1.");
    assert_eq!(configure(&mut c, TOKEN_A, "new", "helper").await.unwrap().agent_version, 2);
    assert_eq!(ask(&mut c, TOKEN_A, "new").await, "system: You are v2.");

    // MigrateSessions moves the label-selected set at their next turn, and only them.
    let migrate = MigrateSessionsRequest {
        label_selector: "group=x".into(),
        agent: "helper".into(),
        to_version: 2,
        ..Default::default()
    };
    let reply = c.migrate_sessions(authed(migrate, TOKEN_A)).await.unwrap().into_inner();
    let mut moved: Vec<String> = reply.migrated.iter().map(|s| s.id.clone()).collect();
    moved.sort();
    assert_eq!(moved, ["s1", "s2"]);
    assert_eq!(ask(&mut c, TOKEN_A, "s1").await, "system: You are v2.");
    assert_eq!(ask(&mut c, TOKEN_A, "s2").await, "system: You are v2.");
    assert_eq!(ask(&mut c, TOKEN_A, "s3").await, "system: You are v1.");
    let on_v1 = ListSessionsRequest { agent: "helper".into(), agent_version: 1, ..Default::default() };
    let on_v1 = c.list_sessions(authed(on_v1, TOKEN_A)).await.unwrap().into_inner().sessions;
    assert_eq!(on_v1.iter().map(|s| s.session.as_ref().unwrap().id.as_str()).collect::<Vec<_>>(), ["s3"]);

    // Tenant B: the agent does not exist for it, whichever way it asks.
    let theirs = get(&mut c, TOKEN_B, "helper").await.unwrap_err();
    let nobodys = get(&mut c, TOKEN_B, "nobody").await.unwrap_err();
    assert_eq!(theirs.code(), Code::NotFound);
    assert_eq!(theirs.message(), nobodys.message().replace("nobody", "helper"), "no existence leak");
    let used = configure(&mut c, TOKEN_B, "b1", "helper").await.unwrap_err();
    let unknown = configure(&mut c, TOKEN_B, "b1", "nobody").await.unwrap_err();
    assert_eq!(used.code(), Code::InvalidArgument);
    assert_eq!(used.message(), unknown.message().replace("nobody", "helper"));
    let deleted = c.delete_agent(authed(DeleteAgentRequest { name: "helper".into() }, TOKEN_B)).await.unwrap_err();
    assert_eq!(deleted.code(), Code::NotFound);
    let listed = c.list_agents(authed(ListAgentsRequest {}, TOKEN_B)).await.unwrap().into_inner().agents;
    assert!(listed.iter().all(|a| a.name != "helper"), "{listed:?}");
    // B's own agent of the same name is another agent: A's is unchanged.
    assert_eq!(put(&mut c, TOKEN_B, "helper", "system = \"B's\"").await.unwrap().version, 1);
    assert_eq!(get(&mut c, TOKEN_A, "helper").await.unwrap().version, 2);
    let a_session = MigrateSessionsRequest {
        sessions: vec![SessionRef { tenant: "tenant-a".into(), id: "s3".into() }],
        agent: "helper".into(),
        ..Default::default()
    };
    assert_eq!(c.migrate_sessions(authed(a_session, TOKEN_B)).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(ask(&mut c, TOKEN_A, "s3").await, "system: You are v1.");

    // A file agent is shared, read-only through the API.
    let file = get(&mut c, TOKEN_B, "scripted").await.unwrap();
    assert!(file.from_file);
    let refused = put(&mut c, TOKEN_B, "scripted", "system = \"mine\"").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);

    // Each version runs on its own model and calls only its own tools.
    put(&mut c, TOKEN_A, "far", "model = \"down\"").await.unwrap();
    configure(&mut c, TOKEN_A, "f1", "far").await.unwrap();
    turn(&mut c, TOKEN_A, "f1", "hello").await;
    let ended = last_turn_end(&mut c, TOKEN_A, "f1").await;
    assert!(matches!(&ended, Some(Reason::Error(e)) if e.code == "model_unavailable"), "{ended:?}");
    put(&mut c, TOKEN_A, "narrow", "tools = [\"echo\"]").await.unwrap();
    configure(&mut c, TOKEN_A, "n1", "narrow").await.unwrap();
    let result = tool_result(&mut c, TOKEN_A, "n1", "[[tool:sleep 1]]").await;
    assert!(result.contains("tool sleep is not available to agent narrow (its tools: echo)"), "{result}");

    // Deleting hides the agent from new sessions; its sessions keep running their version.
    c.delete_agent(authed(DeleteAgentRequest { name: "helper".into() }, TOKEN_A)).await.unwrap();
    assert_eq!(configure(&mut c, TOKEN_A, "late", "helper").await.unwrap_err().code(), Code::InvalidArgument);
    assert_eq!(ask(&mut c, TOKEN_A, "s3").await, "system: You are v1.");
}

/// The done-when of issue 45 on a local cluster (2 workers, 2 gateways, one nats-server): an agent put
/// through one gateway is run at once by sessions configured through the other; it changes through the API
/// and a file agent through a new configuration file and a rolling restart of the workers; pinned sessions
/// answer as their version throughout, new ones as the newest, and `MigrateSessions` moves the labelled one.
mod cluster {
    use std::time::Duration;

    use turnstile_tests::{Cluster, ClusterOptions};

    use super::*;

    const FILE_V1: &str = "[agents.desk]\nsystem = \"File v1.\"\nversion_policy = \"pin\"\n";
    const FILE_V2: &str = "[agents.desk]\nsystem = \"File v2.\"\nversion_policy = \"pin\"\n";

    #[tokio::test]
    async fn versions_hold_across_gateways_and_a_rolling_restart_with_a_new_file() {
        let (_dir, path) = config_file(FILE_V1);
        let mut opts = ClusterOptions::new(2, 2);
        opts.worker_args = config_args(&path);
        opts.gateway_args = config_args(&path);
        let mut cluster = Cluster::start_with(opts).await.unwrap();
        cluster.wait_balanced().await.unwrap();
        let (mut g0, mut g1) = (cluster.client(0), cluster.client(1));

        put(&mut g0, "", "helper", "system = \"You are v1.\"\nversion_policy = \"pin\"").await.unwrap();
        for id in ["c1", "c2"] {
            assert_eq!(configure(&mut g1, "", id, "helper").await.unwrap().agent_version, 1);
            assert_eq!(ask(&mut g1, "", id).await, "system: You are v1.");
        }
        assert_eq!(configure(&mut g0, "", "f1", "desk").await.unwrap().agent_version, 1);
        assert_eq!(ask(&mut g0, "", "f1").await, "system: File v1.");

        // v2 through one gateway; a session configured through the other runs it at once.
        assert_eq!(
            put(&mut g1, "", "helper", "system = \"You are v2.\"\nversion_policy = \"pin\"").await.unwrap().version,
            2
        );
        assert_eq!(configure(&mut g0, "", "n1", "helper").await.unwrap().agent_version, 2);
        assert_eq!(ask(&mut g0, "", "n1").await, "system: You are v2.");
        assert_eq!(ask(&mut g0, "", "c1").await, "system: You are v1.");

        // A new file and a rolling restart of the workers: the file agent gets version 2.
        std::fs::write(&path, FILE_V2).unwrap();
        for w in 0..cluster.workers() {
            cluster.sigterm_worker(w, Duration::from_secs(15)).await;
            cluster.restart_worker(w).await.unwrap();
        }
        cluster.wait_balanced().await.unwrap();
        let desk = get(&mut g1, "", "desk").await.unwrap();
        assert_eq!((desk.version, desk.from_file), (2, true));
        assert_eq!(ask(&mut g1, "", "f1").await, "system: File v1.", "pinned across the restart");
        assert_eq!(configure(&mut g1, "", "f2", "desk").await.unwrap().agent_version, 2);
        assert_eq!(ask(&mut g1, "", "f2").await, "system: File v2.");
        assert_eq!(ask(&mut g1, "", "c2").await, "system: You are v1.");

        // MigrateSessions moves the labelled session at its next turn, and only it.
        let labels =
            SetLabelsRequest { session: own("c1"), labels: [("wave".into(), "1".into())].into(), ..Default::default() };
        g0.set_labels(labels).await.unwrap();
        let migrate = MigrateSessionsRequest {
            label_selector: "wave=1".into(),
            agent: "helper".into(),
            to_version: 2,
            ..Default::default()
        };
        // The index a selector reads follows the logs: wait until the label is there.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let moved = loop {
            let reply = g1.migrate_sessions(migrate.clone()).await.unwrap().into_inner();
            if !reply.migrated.is_empty() || tokio::time::Instant::now() > deadline {
                break reply.migrated;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(moved.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["c1"]);
        assert_eq!(ask(&mut g1, "", "c1").await, "system: You are v2.");
        assert_eq!(ask(&mut g1, "", "c2").await, "system: You are v1.");

        // Nothing lost or duplicated: each session has exactly one reply per question it was asked.
        for (id, asked) in [("c1", 3), ("c2", 3), ("f1", 2), ("n1", 1), ("f2", 1)] {
            let req = GetTranscriptRequest { session: own(id), after_seq: 0, page_size: 1000 };
            let items = g0.get_transcript(req).await.unwrap().into_inner().items;
            let replies = items.iter().filter(|i| matches!(i.item, Some(Item::Assistant(_)))).count();
            let questions = items.iter().filter(|i| matches!(i.item, Some(Item::User(_)))).count();
            assert_eq!((questions, replies), (asked, asked), "{id}");
        }
    }
}

/// `turnstile dev --data-dir`: agents and their versions are kept beside the sessions, and a restarted
/// server runs a pinned session on its version as before.
#[tokio::test]
async fn agents_in_a_data_directory_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = DevServer::start_with(DevOptions::data_dir(dir.path())).await.unwrap();
    let mut c = server.client();
    put(&mut c, "", "helper", "system = \"You are v1.\"\nversion_policy = \"pin\"").await.unwrap();
    configure(&mut c, "", "s1", "helper").await.unwrap();
    put(&mut c, "", "helper", "system = \"You are v2.\"\nversion_policy = \"pin\"").await.unwrap();
    server.stop().await;

    let server = DevServer::start_with(DevOptions::data_dir(dir.path())).await.unwrap();
    let mut c = server.client();
    assert_eq!(get(&mut c, "", "helper").await.unwrap().version, 2);
    assert_eq!(ask(&mut c, "", "s1").await, "system: You are v1.");
    assert_eq!(configure(&mut c, "", "s2", "helper").await.unwrap().agent_version, 2);
    assert_eq!(ask(&mut c, "", "s2").await, "system: You are v2.");
}

/// `GET path` on the protocols' HTTP port with `token` as the bearer token: the status and the body.
async fn http_get(addr: std::net::SocketAddr, path: &str, token: &str) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap();
    let body = answer.split_once("\r\n\r\n").map(|(_, body)| body).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}")))
}

/// Issue 45: an agent put through the API is a model of the OpenAI protocol (`/v1/models`) for its tenant,
/// and for no other, beside the file's agents that serve the tenant; `spawn_agent` runs it as a child of
/// its tenant's sessions, and another tenant's call of it is refused as for an unknown agent.
#[tokio::test]
async fn api_agents_are_openai_models_and_children_of_their_own_tenant_only() {
    let (dir, path) =
        config_file("[agents.only-b]\ntenants = [\"tenant-b\"]\n[agents.parent]\ntools = [\"spawn_agent\"]\n");
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")).unwrap();
    let mut args = config_args(&path);
    args.extend(["--auth-tokens".to_owned(), tokens.display().to_string()]);
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let http = server.http_addr().expect("the protocols' HTTP port");
    let mut c = server.client();
    put(&mut c, TOKEN_A, "helper", "system = \"You help.\"").await.unwrap();

    let ids = |body: &serde_json::Value| -> Vec<String> {
        body["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
    };
    let (status, a) = http_get(http, "/v1/models", TOKEN_A).await;
    assert_eq!((status, ids(&a)), (200, vec!["helper".to_owned(), "parent".to_owned(), "scripted".to_owned()]));
    let (status, b) = http_get(http, "/v1/models", TOKEN_B).await;
    assert_eq!((status, ids(&b)), (200, vec!["only-b".to_owned(), "parent".to_owned(), "scripted".to_owned()]));
    let (status, helper) = http_get(http, "/v1/models/helper", TOKEN_A).await;
    assert_eq!((status, helper["id"].as_str()), (200, Some("helper")));
    let (status, hidden) = http_get(http, "/v1/models/helper", TOKEN_B).await;
    assert_eq!((status, hidden["error"]["code"].as_str()), (404, Some("model_not_found")));
    let (status, _) = http_get(http, "/v1/models/only-b", TOKEN_A).await;
    assert_eq!(status, 404, "a file agent confined to another tenant is no model of this one");

    // spawn_agent: tenant A's child runs A's agent (its system prompt answers); B's cannot name it.
    let spawn = "[[tool:spawn_agent helper [[system]] who are you?]]";
    configure(&mut c, TOKEN_A, "pa", "parent").await.unwrap();
    let result = tool_result(&mut c, TOKEN_A, "pa", spawn).await;
    assert_eq!(result.trim(), "system: You help.");
    configure(&mut c, TOKEN_B, "pb", "parent").await.unwrap();
    let refused = tool_result(&mut c, TOKEN_B, "pb", spawn).await;
    configure(&mut c, TOKEN_B, "pc", "parent").await.unwrap();
    let unknown = tool_result(&mut c, TOKEN_B, "pc", "[[tool:spawn_agent nobody hi]]").await;
    assert!(refused.contains("\"helper\" is not configured"), "{refused}");
    assert_eq!(refused.replace("helper", "nobody").replace("pb-", "pc-"), unknown, "no existence leak");
}
